"""Per-session conversation of the engine thinker, rendered as chat messages.

The engine's prefix cache (vLLM's automatic prefix caching, SGLang's radix cache) hits only when
a turn's messages start with exactly the tokens of the turn before. So every finished turn is
stored as the text it will always render as, the system message stays the same, and a turn is
changed after the fact only for a reason the caller can see: a barge-in cut its reply to the
part that was heard, a speculation was superseded, or a tool call's result came in (each
changes the prefix from that turn on, once).

What the caller heard of an interrupted reply: the words its played audio voiced, when the
session knew them (``Heard.text``, from the TTS stage's chunks), else the heard share of the
audio taken as the heard share of the text (``heard_part``); ``heard_cut`` picks, for this thinker
and the local one alike. A cut reply ends in "..." so the model sees it was interrupted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from duplex.runtime.contract import Heard, ToolOutput, heard_cut

PENDING_RESULT = "(no result yet)"


@dataclass
class Call:
    call_id: str
    name: str
    arguments: str
    output: str | None = None


@dataclass
class Turn:
    request_id: str
    user: str | None  # None: a turn that only answered tool results
    reply: str  # what the agent said before any call (all of it, when it called nothing)
    calls: list[Call] = field(default_factory=list)
    answer: str = ""  # what it said after the results of server-side calls, in the same turn

    def cut(self, heard: Callable[[str], str]) -> None:
        """Keep the heard part of what was said last (a server call's answer is said after the reply)."""
        if self.answer:
            self.answer = heard(self.answer)
        else:
            self.reply = heard(self.reply)


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)
    interrupted: Turn | None = None  # aborted: joins the history when a later request says what was heard
    cut: set[str] = field(default_factory=set)  # request ids already cut to their heard part

    def find_call(self, call_id: str) -> Call | None:
        for turn in self.turns:
            for call in turn.calls:
                if call.call_id == call_id:
                    return call
        return None

    def apply_outputs(self, outputs: list[ToolOutput]) -> list[str]:
        """Record tool results on their calls; returns the ids it did not know."""
        unknown = []
        for result in outputs:
            call = self.find_call(result.call_id)
            if call is None:
                unknown.append(result.call_id)
            else:
                call.output = result.output
        return unknown

    def drop(self, request_id: str) -> None:
        """A speculative turn the caller spoke past: it leaves the history."""
        if self.interrupted is not None and self.interrupted.request_id == request_id:
            self.interrupted = None
        self.turns = [turn for turn in self.turns if turn.request_id != request_id]

    def apply_heard(self, heard: Heard, chars_per_s: float) -> None:
        if not heard.request_id or heard.request_id in self.cut:
            return  # every request of a turn repeats the edit: apply it once
        cut = heard_cut(heard.text, heard.audio_end_ms, heard.audio_ms, chars_per_s)
        if self.interrupted is not None and self.interrupted.request_id == heard.request_id:
            turn, self.interrupted = self.interrupted, None
            turn.cut(cut)
            self.turns.append(turn)
        else:
            for turn in self.turns:
                if turn.request_id == heard.request_id:
                    turn.cut(cut)
                    break
            else:
                return
        self.cut.add(heard.request_id)

    def messages(self, system: str) -> list[dict[str, Any]]:
        """The chat messages of the history (the OpenAI wire shape is a dict per message)."""
        out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for turn in self.turns:
            if turn.user is not None:
                out.append({"role": "user", "content": turn.user})
            if turn.calls:
                out.append({"role": "assistant", "content": turn.reply or None, "tool_calls": [
                    {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in turn.calls]})
                for call in turn.calls:
                    out.append({"role": "tool", "tool_call_id": call.call_id,
                                "content": call.output if call.output is not None else PENDING_RESULT})
                if turn.answer:
                    out.append({"role": "assistant", "content": turn.answer})
            elif turn.reply or turn.user is not None:
                out.append({"role": "assistant", "content": turn.reply or "..."})
        return out

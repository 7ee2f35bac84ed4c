"""The engine thinker: a ``stream`` stage runner (``contract.StreamRunner``) that answers each
turn with a streamed chat completion from an OpenAI-compatible engine (vLLM, SGLang, a hosted
endpoint). The engine batches; this stage only keeps one stream per request in flight.

Per request: the history edits the request carries (``heard``: cut that reply to what the caller
heard; ``supersedes``: drop those speculative turns; ``tool_outputs``: results of earlier calls)
are applied to the session's conversation, the final ``Transcript`` is awaited (interim ones are
ignored), and the conversation's messages plus the user line go to the engine. Text deltas are
emitted as ``AgentText`` the moment they arrive (the TTS stage cuts the first phrase as soon as
it is complete); the model's calls of the client's functions as ``ToolCallDelta`` /
``ToolCallDone``; calls of server-side tools (``server_tools.py``) are made here and their
answer spoken in the same request. A finished turn joins the history; an aborted one waits
aside until a later request says what of it was heard.

A request that answers only tool results (no user text) may not be forced to call again: a
forced or required ``tool_choice`` applies to the caller's turns, the answer to a result runs
with ``auto`` (else a forced call would repeat forever).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx

from duplex.models.engine.client import CallPiece, EngineClient, TextPiece, new_call_id
from duplex.models.engine.conversation import Call, Conversation, Turn
from duplex.models.engine.server_tools import ServerTools, call_server_tool
from duplex.runtime.contract import (
    AgentText,
    RecentSessions,
    Request,
    SessionEnd,
    ToolCallDelta,
    ToolCallDone,
    ToolSpec,
    Transcript,
    TurnRequest,
    WorkItem,
)


@dataclass(frozen=True)
class ThinkerSettings:
    system: str = ""  # the system message, unless the session sets instructions
    max_new_tokens: int = 64
    max_call_tokens: int = 256  # budget of a response forced to call a function (its JSON arguments)
    stop: tuple[str, ...] = ()  # stop strings for spoken replies (not sent when a call is forced)
    speech_chars_per_s: float = 15.0  # the TTS voice's speaking rate (heard-part estimate)
    max_tool_rounds: int = 2  # server-side tool rounds within one request


class EngineThinker:
    def __init__(self, client: EngineClient, settings: ThinkerSettings,
                 server_tools: ServerTools | None = None) -> None:
        self.client, self.settings = client, settings
        self.server_tools = (server_tools or ServerTools()).by_name()
        self.conversations: RecentSessions[Conversation] = RecentSessions(Conversation, max_sessions=1024)
        self._streams = 0
        self._http: httpx.AsyncClient | None = None  # server-side tools; made on the stage's loop

    def held(self) -> dict[str, int]:
        return {"open_streams": self._streams}

    async def run(self, request_id: str, request: Request, inputs: AsyncIterator[WorkItem]) -> AsyncIterator[Any]:
        if isinstance(request, SessionEnd):
            async for _ in inputs:
                pass
            self.conversations.forget(request.session_id or request_id)
            return
        request = cast(TurnRequest, request)  # an overlap probe goes to the entry stages only
        conversation = self.conversations.get(request.session_id or request_id)
        self._edit(conversation, request)
        user = await _final_text(inputs)
        if not user and not any(result.speak for result in request.tool_outputs):
            return  # nothing to answer (an empty turn, or only results a barge-in fenced)
        turn = Turn(request_id, user or None, "")
        messages = conversation.messages(request.instructions or self.settings.system)
        if user:
            messages.append({"role": "user", "content": user})
        try:
            async for output in self._answer(turn, messages, request):
                yield output
        except (asyncio.CancelledError, GeneratorExit):  # aborted, or its reader stopped
            conversation.interrupted = turn  # what of it was heard comes with a later request
            raise
        conversation.turns.append(turn)

    def _edit(self, conversation: Conversation, request: TurnRequest) -> None:
        for superseded in request.supersedes:
            conversation.drop(superseded)
        if request.heard is not None:
            conversation.apply_heard(request.heard, self.settings.speech_chars_per_s)
        unknown = conversation.apply_outputs(request.tool_outputs)
        if unknown:
            raise ValueError(f"function_call_output for unknown call_id {unknown}")

    async def _answer(self, turn: Turn, messages: list[dict[str, Any]], request: TurnRequest) -> AsyncIterator[Any]:
        tools = [_tool_param(spec) for spec in request.tools]
        tools += [_tool_param(ToolSpec(t.name, t.description, t.parameters, t.strict))
                  for t in self.server_tools.values() if t.name not in {spec.name for spec in request.tools}]
        choice = request.tool_choice if turn.user is not None else "auto"
        for round_ in range(self.settings.max_tool_rounds + 1):
            calls: dict[int, Call] = {}
            async for output in self._one_completion(turn, messages, tools, choice, calls, request.max_new_tokens,
                                                     after_calls=round_ > 0):
                yield output
            turn.calls.extend(calls.values())
            for call in calls.values():
                if call.name not in self.server_tools:
                    yield ToolCallDone(call.call_id, call.name, call.arguments)
            server_calls = [call for call in calls.values() if call.name in self.server_tools]
            if not server_calls:
                return
            failed = await self._call_server_tools(server_calls)
            if failed:
                text = " ".join(self.server_tools[call.name].fallback for call in failed)
                turn.answer += text
                yield AgentText(text)
                return
            messages = messages + _call_messages(turn, server_calls)
            choice = "auto"

    async def _one_completion(self, turn: Turn, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                              choice: str, calls: dict[int, Call], max_tokens: int | None,
                              after_calls: bool) -> AsyncIterator[Any]:
        forced = bool(tools) and choice not in ("auto", "none")
        fields = {"stop": list(self.settings.stop)} if self.settings.stop and not forced else None
        budget = self.settings.max_call_tokens if forced else (max_tokens or self.settings.max_new_tokens)
        self._streams += 1
        try:
            pieces = self.client.stream(messages, budget, tools or None, _tool_choice(choice) if tools else None,
                                        fields)
            async for piece in pieces:
                if isinstance(piece, TextPiece):
                    text = piece.text.lstrip() if not (turn.answer if after_calls else turn.reply) else piece.text
                    if not text:
                        continue
                    if after_calls:
                        turn.answer += text
                    else:
                        turn.reply += text
                    yield AgentText(text)
                elif isinstance(piece, CallPiece):
                    call = calls.get(piece.index)
                    if call is None:
                        call = calls[piece.index] = Call(piece.call_id or new_call_id(), piece.name, "")
                    call.arguments += piece.arguments
                    if call.name not in self.server_tools:
                        yield ToolCallDelta(call.call_id, call.name, piece.arguments)
        finally:
            self._streams -= 1

    async def _call_server_tools(self, calls: list[Call]) -> list[Call]:
        if self._http is None:
            self._http = httpx.AsyncClient()
        failed = []
        for call in calls:
            result = await call_server_tool(self._http, self.server_tools[call.name], call.arguments)
            call.output = result.output
            if not result.ok:
                failed.append(call)
        return failed


async def _final_text(inputs: AsyncIterator[WorkItem]) -> str:
    """The turn's user text: the final transcript (or the last one, at the end of the input)."""
    text = ""
    async for item in inputs:
        if item.data is not None and not isinstance(item.data, Transcript):
            raise ValueError(f"expected a Transcript, got {type(item.data).__name__}")
        if isinstance(item.data, Transcript):
            text = item.data.text
    return " ".join(text.split())


def _tool_param(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters or {"type": "object"}}
    if spec.description:
        function["description"] = spec.description
    if spec.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _call_messages(turn: Turn, calls: list[Call]) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": turn.reply or None, "tool_calls": [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
        *({"role": "tool", "tool_call_id": c.call_id, "content": c.output or ""} for c in calls)]

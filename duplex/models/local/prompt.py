"""Persona + few-shot prompt for a base (not instruction-tuned) LLM, and per-session history.

Gemma 3 270M has no chat template: it continues text. So the prompt is a written scene (who the
agent is, how it talks), a few example exchanges, then the session's real history, ending with
the agent's name and a colon. The agent's turn ends at the first line break, which the examples
teach (every turn is one line).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

USER_LABEL = "Customer"
AGENT_LABEL = "Mia"

BUBBLE_TEA_PERSONA = (
    "Mia works at the counter of Pearl Cup, a bubble tea shop. She takes orders in a friendly way: "
    "she repeats the order back in one short sentence and asks one question about flavor, size, "
    "sugar, ice or toppings. Flavors: classic milk tea, taro, matcha, brown sugar, mango and "
    "passion fruit. Toppings: tapioca pearls, grass jelly, pudding. Regular $5, large $6."
)

# The examples teach the 270M base model the shape of a reply more than the description does:
# echo the order, then one question. Measured: without a request like the user's in the
# examples, the model answered "No, no, no." to "I would like a bubble tea with less ice."
BUBBLE_TEA_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("Hi there.", "Hi, welcome to Pearl Cup! What can I get for you today?"),
    ("Can I get a mango tea with no sugar?", "Sure, one mango tea with no sugar. Would you like a regular or a large?"),
    ("A large one.", "Okay, a large mango tea. Would you like any toppings?"),
    ("What toppings do you have?", "We have tapioca pearls, grass jelly and pudding. Which one would you like?"),
    ("I'll have a bubble tea with extra sugar.", "Sure, one bubble tea with extra sugar. Which flavor would you like?"),
    ("How much is it?", "A regular is five dollars and a large is six dollars."),
)


# Words the speech recognizer should expect in this persona's conversations.
BUBBLE_TEA_ASR_HINT = "Bubble tea order."


@dataclass(frozen=True)
class Persona:
    description: str = BUBBLE_TEA_PERSONA
    examples: tuple[tuple[str, str], ...] = BUBBLE_TEA_EXAMPLES
    user_label: str = USER_LABEL
    agent_label: str = AGENT_LABEL

    def preamble(self) -> str:
        """The text every session's prompt starts with (a prefix shared by all sessions)."""
        lines = [self.description, ""]
        for user, agent in self.examples:
            lines.append(f"{self.user_label}: {user}")
            lines.append(f"{self.agent_label}: {agent}")
        lines.append("")  # a blank line: the real conversation starts here
        return "\n".join(lines) + "\n"

    def turn_text(self, user: str, agent: str | None) -> str:
        text = f"{self.user_label}: {clean_line(user)}\n{self.agent_label}:"
        return text if agent is None else f"{text} {clean_line(agent)}\n"


def clean_line(text: str) -> str:
    """One line: a line break inside a turn would end it early in the one-line-per-turn format."""
    return " ".join(text.split())


@dataclass
class SessionHistory:
    """Finished (user, agent) turns of one conversation, oldest first, each with the id of the
    request that made it, so a later request can say what became of it (heard in part, or
    superseded). ``interrupted`` is the last aborted turn, kept aside until such word comes:
    without it, nobody knows what of it the caller heard."""

    turns: list[tuple[str, str]] = field(default_factory=list)
    request_ids: list[str | None] = field(default_factory=list)
    interrupted: tuple[str, str, str] | None = None  # (request id, user line, reply as far as written)
    truncated: set[str] = field(default_factory=set)  # request ids already cut to their heard part

    def add(self, user: str, agent: str, request_id: str | None = None) -> None:
        self.turns.append((clean_line(user), clean_line(agent)))
        self.request_ids.append(request_id)

    def drop(self, request_id: str) -> bool:
        """Forget a turn whose user line a later request repeats (a superseded speculation)."""
        if self.interrupted is not None and self.interrupted[0] == request_id:
            self.interrupted = None
            return True
        if request_id not in self.request_ids:
            return False
        index = self.request_ids.index(request_id)
        del self.turns[index], self.request_ids[index]
        return True

    def truncate(self, request_id: str, heard: Callable[[str], str]) -> bool:
        """Keep only ``heard(reply)`` of that turn's reply (an interrupted turn joins the history)."""
        if request_id in self.truncated:
            return False  # every request of a turn repeats the edit: apply it once
        if self.interrupted is not None and self.interrupted[0] == request_id:
            _, user, reply = self.interrupted
            self.interrupted = None
            self.add(user, heard(reply), request_id)
        elif request_id in self.request_ids:
            index = self.request_ids.index(request_id)
            user, reply = self.turns[index]
            self.turns[index] = (user, clean_line(heard(reply)))
        else:
            return False
        self.truncated.add(request_id)
        return True


def select_recent(turns: Sequence[Sequence[int]], budget: int) -> list[Sequence[int]]:
    """The newest turns (returned oldest first) whose token counts add up to at most ``budget``;
    it stops at the first turn that does not fit, so the kept history has no gaps."""
    kept: list[Sequence[int]] = []
    for turn in reversed(turns):
        if len(turn) > budget:
            break
        kept.append(turn)
        budget -= len(turn)
    return kept[::-1]


def build_prompt(persona: Persona, history: Sequence[tuple[str, str]], user_text: str) -> str:
    """The whole prompt text of a turn (for inspection and tests; the thinker works in tokens)."""
    turns = "".join(persona.turn_text(user, agent) for user, agent in history)
    return persona.preamble() + turns + persona.turn_text(user_text, None)

"""What stages that keep per-session state share: a bounded store of the most recently active
sessions' state, and the estimate of which words of an interrupted reply the caller heard.
Models reach these through ``runtime.contract``."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

T = TypeVar("T")


class RecentSessions(Generic[T]):
    """State of the ``max_sessions`` most recently active sessions (older ones are forgotten)."""

    def __init__(self, new: Callable[[], T], max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._new = new
        self._sessions: OrderedDict[str, T] = OrderedDict()

    def get(self, session_id: str) -> T:
        state = self._sessions.pop(session_id, None)
        if state is None:
            state = self._new()
        self._sessions[session_id] = state
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return state

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def has(self, session_id: str) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)


def heard_part(reply: str, audio_end_ms: int, audio_ms: int | None, chars_per_s: float) -> str:
    """The words of ``reply`` a caller heard when its audio was cut at ``audio_end_ms``.

    There is no alignment of text to audio, so the heard share of the text is taken to be the
    heard share of the audio: ``audio_ms`` (all of the reply's audio) when the caller knows it,
    else the reply's length at a nominal ``chars_per_s``. A word counts as heard when all of it
    lies within that share. A cut reply ends in "..." (the model sees it was interrupted)."""
    if not reply:
        return "..."
    total_ms = audio_ms if audio_ms else 1000 * len(reply) / chars_per_s
    share = max(0.0, min(1.0, audio_end_ms / total_ms))
    if share >= 1.0:
        return reply
    budget = share * len(reply)
    words = [m.group() for m in re.finditer(r"\S+", reply) if m.end() <= budget]
    return " ".join(words) + "..."


def heard_cut(text: str | None, audio_end_ms: int, audio_ms: int | None,
              chars_per_s: float) -> Callable[[str], str]:
    """How to cut a reply to what its caller heard (the fields of ``contract.Heard``): to the
    words heard exactly, when the session knew which text each played chunk voiced (``text``),
    else to the estimate of ``heard_part``."""
    if text is None:
        return partial(heard_part, audio_end_ms=audio_end_ms, audio_ms=audio_ms or None, chars_per_s=chars_per_s)
    heard = " ".join(text.split())
    return lambda reply: reply if len(heard.split()) >= len(reply.split()) else heard + "..."

"""The session's one narrow door into the runtime: start a request, stream caller audio into
it, read what it produces, abort it. A protocol only: the server room plugs a runtime in
(``duplex/server/runtime_adapter.py``), tests plug in a fake. The items are the runtime's
public contract (``duplex.runtime.contract``); no runtime class is visible from here."""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
import numpy as np

from duplex.runtime.contract import CallerAudio, Item, Request, SessionEnd, StageError


class TurnStatus(str, enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class TurnEnded(msgspec.Struct, frozen=True):
    """The request is over; nothing follows this in ``Turn.events()``."""

    status: TurnStatus
    error: StageError | None = None


TurnEvent = Item | TurnEnded


class Turn(Protocol):
    """One request in flight."""

    request_id: str

    def feed(self, audio: CallerAudio, eos: bool = False) -> None: ...
    def abort(self) -> None: ...  # idempotent; harmless after the request ended
    def events(self) -> AsyncIterator[TurnEvent]: ...


class VoiceRuntime(Protocol):
    def start(self, request: Request) -> Turn: ...
    async def stats(self) -> dict[str, dict]: ...


def announce_session_end(runtime: VoiceRuntime, session_id: str) -> None:
    """Tell the pipeline a session is over, so per-session state (history, cached KV) goes."""
    try:
        runtime.start(SessionEnd(session_id=session_id)).feed(CallerAudio(np.zeros(0, np.float32), [], 20), eos=True)
    except RuntimeError as exc:  # the runtime is shutting down: its state goes with it
        logging.getLogger("duplex.session").info("session %s: end not announced: %s", session_id, exc)

"""The session's one narrow door into the runtime: start a turn, stream user audio into it,
read its output chunks, abort it. Nothing else of the runtime is visible to a session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol

import numpy as np

from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import OutputChunk, RequestFinished, RequestHandle

INPUT_RATE = 16000


@dataclass(frozen=True)
class TurnOutput:
    """One piece of a response, in the voice pipeline convention (any field may be absent)."""

    audio: np.ndarray | None = None  # float32 mono agent speech
    sample_rate: int = 0
    text: str = ""  # agent transcript delta
    user_text: str = ""  # the user's transcript (from the encoder / ASR stage)
    user_text_final: bool = False


@dataclass(frozen=True)
class TurnEnded:
    status: str  # "completed" | "failed" | "aborted"
    error: str | None = None


class Turn(Protocol):
    request_id: str

    def feed(self, audio: np.ndarray, eos: bool = False) -> None: ...
    def abort(self) -> None: ...
    def events(self) -> AsyncIterator[TurnOutput | TurnEnded]: ...


class VoiceRuntime(Protocol):
    def start_turn(self, params: dict) -> Turn: ...
    async def stats(self) -> dict[str, dict]: ...


class CoordinatorTurn:
    def __init__(self, coordinator: Coordinator, handle: RequestHandle) -> None:
        self._coordinator = coordinator
        self._handle = handle
        self.request_id = handle.request_id

    def feed(self, audio: np.ndarray, eos: bool = False) -> None:
        chunk = {"audio": np.ascontiguousarray(audio, np.float32), "sample_rate": INPUT_RATE}
        self._coordinator.feed(self.request_id, chunk, eos=eos)

    def abort(self) -> None:
        self._coordinator.abort(self.request_id)

    async def events(self) -> AsyncIterator[TurnOutput | TurnEnded]:
        async for event in self._handle:
            if isinstance(event, OutputChunk):
                output = _to_output(event.data)
                if output is not None:
                    yield output
            elif isinstance(event, RequestFinished):
                yield TurnEnded(status=str(event.status.value), error=event.error)


class CoordinatorRuntime:
    """VoiceRuntime over a started Coordinator."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def start_turn(self, params: dict) -> CoordinatorTurn:
        return CoordinatorTurn(self.coordinator, self.coordinator.submit(params=params))

    async def stats(self) -> dict[str, dict]:
        stats = await self.coordinator.stats()
        return {name: {"live_requests": s.live_requests, "resources": dict(s.resources),
                       "counters": dict(getattr(s, "counters", {})), "pid": s.pid,
                       "request_ids": list(getattr(s, "request_ids", []))}
                for name, s in stats.items()}


def _to_output(data: object) -> TurnOutput | None:
    if not isinstance(data, dict):
        return None
    audio = data.get("audio")
    if audio is not None:
        audio = np.asarray(audio, np.float32).reshape(-1)
    return TurnOutput(
        audio=audio,
        sample_rate=int(data.get("sample_rate", 0) or 0),
        text=str(data.get("text", "") or ""),
        user_text=str(data.get("user_text", "") or ""),
        user_text_final=bool(data.get("user_text_final", False)),
    )

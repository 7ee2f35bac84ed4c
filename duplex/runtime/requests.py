"""A request as the coordinator sees it, and the handle its submitter reads events from."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from duplex.runtime.contract import Request, StageError


class RequestStatus(str, enum.Enum):
    PENDING = "pending"  # submitted, no stage has taken it in yet
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def ended(self) -> bool:
        return self in (RequestStatus.COMPLETED, RequestStatus.FAILED, RequestStatus.ABORTED)


@dataclass(frozen=True)
class OutputChunk:
    stage: str
    data: Any
    final: bool  # the stage's last output for this request
    received_ns: int


@dataclass(frozen=True)
class RequestFinished:
    status: RequestStatus
    error: StageError | None = None


Event = OutputChunk | RequestFinished


class RequestHandle:
    """Events of one request, in arrival order; iteration ends after ``RequestFinished``."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.status = RequestStatus.PENDING
        self.error: StageError | None = None
        self._events: asyncio.Queue[Event] = asyncio.Queue()

    def push(self, event: Event) -> None:
        if isinstance(event, RequestFinished):
            self.status = event.status
            self.error = event.error
        self._events.put_nowait(event)

    async def next_event(self) -> Event:
        return await self._events.get()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, RequestFinished):
                return

    async def collect(self) -> tuple[list[OutputChunk], RequestFinished]:
        chunks: list[OutputChunk] = []
        async for event in self:
            if isinstance(event, OutputChunk):
                chunks.append(event)
            else:
                return chunks, event
        raise AssertionError("unreachable")


@dataclass
class RequestState:
    request_id: str
    params: Request
    handle: RequestHandle
    terminals_left: set[str]
    holding: set[str] = field(default_factory=set)  # stages that admitted and not yet released it
    passed: set[str] = field(default_factory=set)  # stages that released it
    input_seq: dict[str, int] = field(default_factory=dict)  # per entry stage
    created: float = field(default_factory=time.monotonic)
    touched: float = 0.0  # supervision clock at its last input, output or progress report (stall deadline)

    @property
    def status(self) -> RequestStatus:
        return self.handle.status

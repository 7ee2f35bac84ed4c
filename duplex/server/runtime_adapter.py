"""The session's port (``duplex.session.port``) over the coordinator: a request per turn, caller
audio streamed into it, its terminal outputs read back as contract items, its end as
``TurnEnded``. The only place that knows both the session's protocol and the runtime's classes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from duplex.runtime.contract import CallerAudio, Payload, Request
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import OutputChunk, RequestFinished, RequestHandle, RequestStatus
from duplex.session.port import TurnEnded, TurnEvent, TurnStatus

_STATUS = {
    RequestStatus.COMPLETED: TurnStatus.COMPLETED,
    RequestStatus.FAILED: TurnStatus.FAILED,
    RequestStatus.ABORTED: TurnStatus.ABORTED,
}


class CoordinatorTurn:
    def __init__(self, coordinator: Coordinator, handle: RequestHandle) -> None:
        self._coordinator = coordinator
        self._handle = handle
        self.request_id = handle.request_id

    def feed(self, audio: CallerAudio, eos: bool = False) -> None:
        self._coordinator.feed(self.request_id, audio, eos=eos)

    def abort(self) -> None:
        self._coordinator.abort(self.request_id)

    async def events(self) -> AsyncIterator[TurnEvent]:
        async for event in self._handle:
            if isinstance(event, OutputChunk):
                if isinstance(event.data, Payload):  # a stage's bare end-of-stream carries none
                    yield cast(TurnEvent, event.data)  # the stages' outputs are the turn's items
            elif isinstance(event, RequestFinished):
                yield TurnEnded(status=_STATUS.get(event.status, TurnStatus.FAILED), error=event.error)


class CoordinatorRuntime:
    """``VoiceRuntime`` over a started ``Coordinator``."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def start(self, request: Request) -> CoordinatorTurn:
        return CoordinatorTurn(self.coordinator, self.coordinator.submit(request))

    async def stats(self, timeout: float = 5.0) -> dict[str, dict]:
        """Every stage: its stats and ``state`` (up / restarting / down); a stage that is not up,
        or did not answer in time, shows as such (with no stats) instead of failing the answer."""
        views = await self.coordinator.collect_stats(timeout)
        states = self.coordinator.supervisor.stage_states()
        out: dict[str, dict] = {}
        for stage in self.coordinator.cfg.stages:
            s = views.get(stage.name)
            if s is None:
                state = states[stage.name].value if states[stage.name].value != "up" else "not answering"
                out[stage.name] = {"state": state, "live_requests": None, "resources": {}, "counters": {},
                                   "pid": None, "request_ids": []}
                continue
            out[stage.name] = {"state": "up", "live_requests": s.live_requests, "resources": dict(s.resources),
                               "counters": dict(s.counters), "pid": s.pid, "request_ids": list(s.request_ids)}
            if s.device_memory is not None:  # a stage on a GPU: bytes its process's allocator holds there
                memory = s.device_memory
                out[stage.name]["device_memory"] = {"device": memory.device, "allocated": memory.allocated,
                                                    "reserved": memory.reserved}
        return out

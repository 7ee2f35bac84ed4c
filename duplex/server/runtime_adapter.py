"""The session's port (``duplex.session.port``) over the coordinator: a request per turn, caller
audio streamed into it, its terminal outputs read back as contract items, its end as
``TurnEnded``. The only place that knows both the session's protocol and the runtime's classes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from duplex.runtime.contract import CallerAudio, Payload, Request
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.queries import StageStatsView
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

    async def stats(self, timeout: float | None = None) -> dict[str, dict]:
        """Every stage: its stats, ``state`` (up / restarting / down) and whether it ``answering``
        within ``timeout`` (default ``supervision.stats_timeout_s``), so a stopped or wedged stage
        costs the answer that bound, not the whole wait. One that did not answer shows no current
        numbers (None, empty), its last pid and ``stats_age_s``, the age of its last stats (None:
        never had any); one that did shows ``stats_age_s`` 0."""
        wait = self.coordinator.cfg.supervision.stats_timeout_s if timeout is None else timeout
        views = await self.coordinator.collect_stats(wait)
        states = self.coordinator.supervisor.stage_states()
        out: dict[str, dict] = {}
        for stage in self.coordinator.cfg.stages:
            state = states[stage.name].value
            view = views.get(stage.name)
            out[stage.name] = (_answered(view) if view is not None
                               else _silent(state, self.coordinator.last_stats(stage.name)))
            out[stage.name]["state"] = state
        return out


def _answered(s: StageStatsView) -> dict:
    out = {"answering": True, "stats_age_s": 0.0, "live_requests": s.live_requests,
           "resources": dict(s.resources), "counters": dict(s.counters), "pid": s.pid,
           "request_ids": list(s.request_ids)}
    if s.device_memory is not None:  # a stage on a GPU: bytes its process's allocator holds there
        memory = s.device_memory
        out["device_memory"] = {"device": memory.device, "allocated": memory.allocated, "reserved": memory.reserved}
    return out


def _silent(state: str, last: tuple[StageStatsView, float] | None) -> dict:
    """A stage with no stats in time: nothing it holds now is known (a waiting loop that reads
    ``live_requests`` keeps waiting); its last pid is kept for whoever needs to look at it."""
    pid = last[0].pid if last is not None and state == "up" else None  # (a restart has a new pid)
    age = round(last[1], 3) if last is not None else None
    return {"answering": False, "stats_age_s": age, "live_requests": None, "resources": {}, "counters": {},
            "pid": pid, "request_ids": []}

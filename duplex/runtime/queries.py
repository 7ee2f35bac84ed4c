"""Questions the coordinator asks its stages and the answers it waits for: a stats query
(broadcast; every stage that is up answers) and a ping (one stage's inbox and back)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from duplex.runtime import messages as m
from duplex.runtime.step_stats import StepHistogram


@dataclass(frozen=True)
class StageStatsView:
    stage: str
    pid: int
    live_requests: int
    resources: dict[str, int]
    counters: dict[str, int]
    request_ids: list[str]
    steps: StepHistogram | None = None
    device_memory: m.DeviceMemory | None = None  # a stage on a GPU: its allocator's bytes there

    @property
    def held(self) -> int:
        """Everything this stage still holds: live requests plus every resource count."""
        return self.live_requests + sum(self.resources.values())


class StageQueries:
    def __init__(self, ids: itertools.count, broadcast: Callable[[m.Message], None],
                 send: Callable[[str, m.Message], None]) -> None:
        self._ids = ids
        self._broadcast = broadcast
        self._send = send
        self._replies: dict[int, asyncio.Future] = {}
        self._collected: dict[int, dict[str, m.StageStats]] = {}
        self._expected: dict[int, set[str]] = {}  # stats query -> stages that can answer it
        # stage -> (its last stats reply, when it came (monotonic)): late replies count too
        self._last: dict[str, tuple[StageStatsView, float]] = {}

    async def stats(self, expected: set[str], timeout: float) -> dict[str, StageStatsView]:
        """The stats of every stage that answers within ``timeout``; returns as soon as all of
        ``expected`` did."""
        query_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._replies[query_id] = future
        self._expected[query_id] = expected
        collected = self._collected[query_id] = {}
        self._broadcast(m.StatsQuery(query_id=query_id))
        try:
            if expected:
                await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            self._replies.pop(query_id, None)
            self._collected.pop(query_id, None)
            self._expected.pop(query_id, None)
        return {name: _view(s) for name, s in collected.items()}

    def last(self, stage: str) -> tuple[StageStatsView, float] | None:
        """The stage's last stats and their age in seconds, answered in time or late (None: never)."""
        last = self._last.get(stage)
        return None if last is None else (last[0], time.monotonic() - last[1])

    async def ping(self, stage: str, timeout: float) -> float:
        """Round trip of a control message to a stage and back, in seconds."""
        query_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._replies[query_id] = future
        self._send(stage, m.Ping(query_id=query_id, sent_ns=time.monotonic_ns()))
        try:
            pong: m.Pong = await asyncio.wait_for(future, timeout)
        finally:
            self._replies.pop(query_id, None)
        return (time.monotonic_ns() - pong.sent_ns) / 1e9

    def on_reply(self, msg: m.StageStats | m.Pong) -> None:
        if isinstance(msg, m.StageStats):
            self._last[msg.stage] = (_view(msg), time.monotonic())
        future = self._replies.get(msg.query_id)
        if future is None or future.done():
            return
        if isinstance(msg, m.Pong):
            future.set_result(msg)
            return
        collected = self._collected[msg.query_id]
        collected[msg.stage] = msg
        if self._expected[msg.query_id] <= collected.keys():
            future.set_result(None)


def _view(s: m.StageStats) -> StageStatsView:
    return StageStatsView(s.stage, s.pid, s.live_requests, dict(s.resources), dict(s.counters),
                          list(s.request_ids), s.steps, s.device_memory)

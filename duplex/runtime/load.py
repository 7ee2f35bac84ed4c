"""The server's load, measured cheaply in the background so that admission can read it without
waiting on anything: the event loop's lag (how late a periodic timer fires) and, per stage, its
queue depth, live requests and recent step time (from the stats the stages report).

``LoadMonitor.snapshot`` is a plain attribute read; the stages are only ever awaited by the
monitor's own task, never by whoever reads the snapshot."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from duplex.config.pipeline import AdmissionConfig
from duplex.runtime.coordinator import Coordinator, StageStatsView
from duplex.runtime.step_stats import StepHistogram

QUEUE_RESOURCES = ("inbox_items", "queued_items", "buffered_inputs")  # inputs waiting in a stage


@dataclass(frozen=True)
class StageLoad:
    queued: int  # inputs waiting (inbox, scheduler queue, buffered out of order)
    live_requests: int
    step_s: float  # mean step time over the last sample interval (or the last one with steps)
    batch: int  # rows one step may take (the scheduler's batch or running-request cap)

    @property
    def wait_s(self) -> float:
        """What a new request would wait here for others: a step for each batch queued ahead. Its
        own step is not counted: that is the latency floor, which refusing others cannot lower
        (and an idle stage keeps its last step time, which must not refuse anyone)."""
        return self.step_s * self.queued / self.batch


@dataclass(frozen=True)
class LoadSnapshot:
    loop_lag_s: float = 0.0  # the worst lateness of the lag timer within the window
    stages: dict[str, StageLoad] = field(default_factory=dict)
    taken_at: float = 0.0  # monotonic time of the stage sample (0: none yet)

    @property
    def turn_wait_s(self) -> float:
        """Estimate of what a new turn would wait for other work: loop lag plus every stage's queue."""
        return self.loop_lag_s + sum(stage.wait_s for stage in self.stages.values())


def _batch(coordinator: Coordinator, stage: str) -> int:
    scheduler = coordinator.cfg.stage(stage).scheduler
    return max(1, int(getattr(scheduler, "max_batch_size", getattr(scheduler, "max_running_requests", 1))))


class LoadMonitor:
    def __init__(self, coordinator: Coordinator, config: AdmissionConfig) -> None:
        self.coordinator = coordinator
        self.config = config
        self.snapshot = LoadSnapshot()
        self._lags: deque[tuple[float, float]] = deque()  # (when, lateness) within the window
        self._last_steps: dict[str, StepHistogram] = {}
        self._step_s: dict[str, float] = {}
        self._tasks: list[asyncio.Task] = []
        self._due = 0.0  # when the lag timer's pending tick is due

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._probe_lag(), name="load-lag"),
                       asyncio.create_task(self._sample_stages(), name="load-stages")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    @property
    def loop_lag_s(self) -> float:
        """Worst lateness of the lag timer in the window, counting a tick that is overdue now
        (a loop blocked this very moment shows at once, not one tick later)."""
        now = time.monotonic()
        horizon = now - self.config.lag_window_s
        overdue = now - self._due if self._due else 0.0
        return max(0.0, overdue, *(lag for when, lag in self._lags if when >= horizon))

    async def _probe_lag(self) -> None:
        period = self.config.probe_interval_s
        while True:
            due = self._due = time.monotonic() + period
            await asyncio.sleep(period)
            now = time.monotonic()
            self._lags.append((now, max(0.0, now - due)))
            while self._lags and self._lags[0][0] < now - self.config.lag_window_s:
                self._lags.popleft()
            self.snapshot = LoadSnapshot(self.loop_lag_s, self.snapshot.stages, self.snapshot.taken_at)

    async def _sample_stages(self) -> None:
        while True:
            views = await self.coordinator.collect_stats(timeout=max(1.0, 2 * self.config.sample_interval_s))
            stages = {name: self._stage_load(name, view) for name, view in views.items()}
            self.snapshot = LoadSnapshot(self.loop_lag_s, stages, time.monotonic())
            await asyncio.sleep(self.config.sample_interval_s)

    def _stage_load(self, name: str, view: StageStatsView) -> StageLoad:
        if view.steps is not None:
            before = self._last_steps.get(name)
            if before is not None and view.steps.steps < before.steps:  # restarted: counts began again
                before = None
            steps = view.steps.steps - (before.steps if before else 0)
            if steps > 0:  # a stage that was idle keeps its last step time
                self._step_s[name] = (view.steps.sum_s - (before.sum_s if before else 0.0)) / steps
            self._last_steps[name] = view.steps
        queued = sum(view.resources.get(kind, 0) for kind in QUEUE_RESOURCES)
        return StageLoad(queued, view.live_requests, self._step_s.get(name, 0.0), _batch(self.coordinator, name))

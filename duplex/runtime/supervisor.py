"""Supervision of the stage processes: start and the ready handshake, death (the process's
sentinel), restarts under a budget that is a rate (``max_restarts`` per ``restart_window_s``),
a stage that is down, a watchdog that kills a process which stops answering pings, and the
per-request stall deadline. Runs on the coordinator's asyncio loop.

No silent hang: a request waiting on a stage that died fails with ``stage_crashed``; while a
stage is down (budget spent, or its restart failed) every live request waiting on it and every
new one fails at once with ``stage_down`` naming it, until the budget window lets a retry bring
it back; a request that makes no progress for ``request_stall_s`` fails with ``timeout``.

Both deadlines run on the supervision clock: it advances with each watchdog tick by at most two
tick periods, so a coordinator loop that was itself blocked (a pong sitting unread in the
socket) never makes a stage or a request look dead. A process's silence, besides, counts towards
the watchdog's limit only while it was hung (``cpu_wait``): time it spent busy or waiting for a
CPU on a busy box counts only up to ten limits, so a starved stage is not killed as a hung one.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from duplex.config.pipeline import PipelineConfig
from duplex.cpu_wait import Silence
from duplex.runtime import messages as m
from duplex.runtime.contract import ErrorCode, StageError
from duplex.runtime.processes import StageProcesses
from duplex.runtime.requests import RequestState

log = logging.getLogger("duplex.supervisor")


class StartError(RuntimeError):
    pass


class ProcessState(str, enum.Enum):
    UP = "up"
    RESTARTING = "restarting"  # died; a new process is starting (requests wait for it)
    DOWN = "down"  # budget spent or restart failed: requests fail at once until it is back


@dataclass
class ProcessHealth:
    state: ProcessState = ProcessState.UP
    restarts: deque[float] = field(default_factory=deque)  # monotonic times of restarts in the window
    watchdog_kills: int = 0
    reason: str = ""  # why it last died, or why it is down
    retry_at: float | None = None  # DOWN: when the budget allows the next try (None: never)
    silence: Silence | None = None  # since its last pong (made by the supervisor: its tick period)
    cpu_wait_s: float = 0.0  # time its processes spent busy or waiting for a CPU while silent, summed
    kill_reason: str | None = None  # set when the watchdog killed it


class Supervised(Protocol):
    """What the supervisor needs of the coordinator."""

    cfg: PipelineConfig
    procs: StageProcesses
    ids: itertools.count  # query ids and ready epochs, shared
    ready: dict[int, set[str]]  # ready epoch -> stages that answered Hello
    closing: bool

    def broadcast(self, message: m.Message) -> None: ...
    def send(self, dst: str, message: m.Message) -> None: ...
    def live_states(self) -> list[RequestState]: ...
    def fail(self, request_id: str, error: StageError) -> bool: ...
    def fail_waiting_on(self, stages: list[str], error: StageError) -> None: ...
    def tombstones(self) -> list[str]: ...
    def forget_stages(self, stages: list[str]) -> None: ...


class Supervisor:
    def __init__(self, coordinator: Supervised) -> None:
        self.coord = coordinator
        self.cfg = coordinator.cfg.supervision
        self.procs = coordinator.procs
        self.health = {process: ProcessHealth(silence=self._silence()) for process in self.procs.groups}
        self.clock = 0.0  # supervision seconds (see the module doc)
        self.restarts = 0
        self.watchdog_kills = 0
        self.timed_out = 0  # requests failed by the stall deadline
        self._tasks: list[asyncio.Task] = []
        self._changed = asyncio.Event()  # a process came (back) up: the death watch re-arms
        self._pings: dict[int, str] = {}  # query id -> process

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        for process in self.procs.groups:
            self.procs.spawn(process)
        await self.await_ready(set(self.procs.groups))
        self._tasks.append(asyncio.create_task(self._watch(), name="supervisor-watch"))
        self._tasks.append(asyncio.create_task(self._tick(), name="supervisor-tick"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def await_ready(self, processes: set[str]) -> None:
        coord = self.coord
        epoch = next(coord.ids)
        stages = {s for p in processes for s in self.procs.groups[p]}
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        while not stages <= coord.ready.get(epoch, set()):
            for process in processes:
                proc = self.procs.procs[process]
                if proc.exitcode is not None:
                    raise StartError(f"stage process {process!r} exited with code {proc.exitcode} while "
                                     f"starting (its log above says why)")
            if time.monotonic() > deadline:
                raise StartError(f"stage processes {sorted(processes)} not ready after "
                                 f"{self.cfg.ready_timeout_s:.0f}s")
            coord.broadcast(m.Hello(epoch=epoch))
            await asyncio.sleep(0.02)
        coord.ready.pop(epoch, None)

    # -- what others ask ----------------------------------------------------------------------
    def stage_states(self) -> dict[str, ProcessState]:
        return {stage: self.health[process].state for process, stages in self.procs.groups.items()
                for stage in stages}

    def down_error(self) -> StageError | None:
        """The error a new request gets while a stage is down (None while every stage can serve)."""
        for process, health in self.health.items():
            if health.state is ProcessState.DOWN:
                return self._down_error(process)
        return None

    def retry_after_s(self) -> float:
        """Seconds until the next try of a down stage (0 when none is down or it never retries)."""
        waits = [h.retry_at - time.monotonic() for h in self.health.values()
                 if h.state is ProcessState.DOWN and h.retry_at is not None]
        return max(0.0, min(waits)) if waits else 0.0

    def restarts_in_window(self, process: str) -> int:
        self._prune(self.health[process])
        return len(self.health[process].restarts)

    def on_pong(self, msg: m.Pong) -> bool:
        """A watchdog ping's answer (False: not one of ours)."""
        process = self._pings.pop(msg.query_id, None)
        if process is None:
            return False
        silence = self.health[process].silence
        if silence is not None:
            silence.heard()
        return True

    # -- death and restarts ---------------------------------------------------------------------
    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            woken = self._changed
            woken.clear()
            watched = [p for p, h in self.health.items() if h.state is ProcessState.UP and p in self.procs.procs]
            sentinels = [self.procs.procs[p].sentinel for p in watched]
            for fd in sentinels:
                loop.add_reader(fd, woken.set)
            try:
                await woken.wait()
            finally:
                for fd in sentinels:
                    loop.remove_reader(fd)
            for process in watched:
                if self.procs.procs[process].exitcode is not None and not self.coord.closing:
                    self._on_died(process)

    def _on_died(self, process: str) -> None:
        health = self.health[process]
        proc = self.procs.procs[process]
        stages = self.procs.groups[process]
        reason = (f"stage {'/'.join(stages)} (process {process!r}, pid {proc.pid}) "
                  f"{health.kill_reason or 'died'} with exit code {proc.exitcode}")
        log.error("%s", reason)
        health.reason, health.kill_reason = reason, None
        health.state = ProcessState.RESTARTING
        self.coord.fail_waiting_on(stages, StageError(ErrorCode.STAGE_CRASHED, reason, stages[0]))
        self._discard(process)
        self._tasks = [task for task in self._tasks if not task.done()]  # finished recoveries
        self._tasks.append(asyncio.create_task(self._recover(process), name=f"supervisor-recover-{process}"))

    def _discard(self, process: str) -> None:
        """Forget a dead (or failed-to-start) process: kill what is left, free its segments."""
        proc = self.procs.procs.pop(process)
        if proc.exitcode is None:
            proc.kill()
        proc.join(5)
        proc.close()
        self._pings = {q: p for q, p in self._pings.items() if p != process}
        self.coord.forget_stages(self.procs.groups[process])

    async def _recover(self, process: str) -> None:
        """Restart under the budget; while it is spent (or a restart failed) the stage is down
        and is tried again when the window allows."""
        health = self.health[process]
        while not self.coord.closing:
            if not self.cfg.restart or self.cfg.max_restarts == 0:
                self._mark_down(process, None)
                return
            self._prune(health)
            now = time.monotonic()
            if len(health.restarts) >= self.cfg.max_restarts:
                await self._down_until(process, health.restarts[0] + self.cfg.restart_window_s)
                continue
            health.restarts.append(now)
            self.procs.restarts[process] += 1
            self.restarts += 1
            if health.state is not ProcessState.DOWN:  # a retry of a down stage keeps refusing
                health.state = ProcessState.RESTARTING
            try:
                self.procs.spawn(process, tombstones=self.coord.tombstones())
                await self.await_ready({process})
            except (StartError, OSError) as exc:  # OSError: the spawn itself (fds, memory)
                health.reason = f"restart of stage {'/'.join(self.procs.groups[process])} failed: {exc}"
                log.error("%s", health.reason)
                if process in self.procs.procs:
                    self._discard(process)
                await self._down_until(process, max(now + self.cfg.restart_window_s / max(1, self.cfg.max_restarts),
                                                    time.monotonic() + 1.0))
                continue
            health.state, health.retry_at, health.silence = ProcessState.UP, None, self._silence()
            self._changed.set()
            log.warning("restarted %s (%d restart(s) in the last %.0f s)", process, len(health.restarts),
                        self.cfg.restart_window_s)
            return

    async def _down_until(self, process: str, retry_at: float) -> None:
        self._mark_down(process, retry_at)
        await asyncio.sleep(max(0.0, retry_at - time.monotonic()))

    def _mark_down(self, process: str, retry_at: float | None) -> None:
        health = self.health[process]
        first = health.state is not ProcessState.DOWN
        health.state, health.retry_at = ProcessState.DOWN, retry_at
        if first:
            log.error("%s", self._down_error(process).message)
        self.coord.fail_waiting_on(self.procs.groups[process], self._down_error(process))

    def _down_error(self, process: str) -> StageError:
        health, stages = self.health[process], self.procs.groups[process]
        if health.retry_at is None:
            then = "not restarting (supervision.restart is off or max_restarts is 0)"
        else:
            then = f"next try in {max(0.0, health.retry_at - time.monotonic()):.1f}s"
        return StageError(ErrorCode.STAGE_DOWN, f"stage {'/'.join(stages)} is down: {health.reason}; {then}",
                          stages[0])

    def _prune(self, health: ProcessHealth) -> None:
        horizon = time.monotonic() - self.cfg.restart_window_s
        while health.restarts and health.restarts[0] <= horizon:
            health.restarts.popleft()

    # -- watchdog and stall deadline ------------------------------------------------------------
    async def _tick(self) -> None:
        period = self.cfg.watchdog_interval_s
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            step = min(now - last, 2 * period)  # a blocked coordinator loop is not the stages' silence
            self.clock += step
            last = now
            if self.cfg.watchdog_timeout_s > 0:
                self._watchdog(now)
            if self.cfg.request_stall_s > 0:
                self._stall_deadline()

    def _watchdog(self, now: float) -> None:
        for process, health in self.health.items():
            proc = self.procs.procs.get(process)
            if health.state is not ProcessState.UP or proc is None or proc.exitcode is not None:
                continue
            silence = health.silence
            assert silence is not None
            health.cpu_wait_s += silence.tick(proc.pid, now)
            if silence.over(self.cfg.watchdog_timeout_s) and health.kill_reason is None:
                health.kill_reason = (f"stopped answering (no reply to the watchdog's pings for "
                                      f"{silence.describe()}, supervision.watchdog_timeout_s "
                                      f"{self.cfg.watchdog_timeout_s:g}); killed")
                health.watchdog_kills += 1
                self.watchdog_kills += 1
                log.error("watchdog: process %r (pid %s) %s", process, proc.pid, health.kill_reason)
                if proc.pid is not None:
                    os.kill(proc.pid, signal.SIGKILL)  # works on a stopped process too; the watch does the rest
                continue
            query_id = next(self.coord.ids)
            self._pings[query_id] = process
            self.coord.send(self.procs.groups[process][0], m.Ping(query_id=query_id, sent_ns=time.monotonic_ns()))

    def _silence(self) -> Silence:
        return Silence(self.cfg.watchdog_interval_s, eager=False)  # a torch process's threads are many

    def _stall_deadline(self) -> None:
        limit = self.cfg.request_stall_s
        for state in self.coord.live_states():
            if self.clock - state.touched <= limit:
                continue
            waiting = sorted(state.holding) or [s.name for s in self.coord.cfg.stages if s.name not in state.passed]
            where = waiting[0] if waiting else ""
            error = StageError(ErrorCode.TIMEOUT, f"no progress for {limit:g}s (supervision.request_stall_s); "
                                                  f"waiting on {', '.join(waiting) or 'the client'}", where)
            self.timed_out += 1
            self.coord.fail(state.request_id, error)

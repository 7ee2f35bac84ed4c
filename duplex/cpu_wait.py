"""Whether a silent process is hung or only slow: what the kernel says it did meanwhile.

Below every layer (it imports nothing of duplex), like ``lifecycle``: the runtime's watchdog over
stage processes and the edge's over media workers both ask it, so that a process that is busy or
starved of the CPU is not taken for a hung one. On a box whose cores a nice-0 engine (a CPU vLLM)
keeps busy, a stage process or a media worker can go seconds without answering a ping though
nothing in it is stuck, and killing it would only fail the calls it serves.

A silent process is *slow* over a watchdog tick when, in that tick, it used the CPU (at least
``BUSY_SHARE`` of the tick), a thread of it sat on a run queue (Linux's per-thread run-queue delay,
``schedstat``; where the kernel keeps none, a thread's state R at the reading says the same) or
waited on the machine (state D: paging, disk), and *hung* otherwise: stopped, deadlocked, asleep
in a call that does not return. Only a hung tick counts towards
the watchdog's limit; a process silent for ``SLOW_LIMIT_FACTOR`` times the limit is ended even if
it was slow all along (a loop that spins never answers either). Where /proc cannot be read (another
OS) nothing is excused: every silent tick counts, as without this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BUSY_SHARE = 0.05  # of a tick: a hung process uses next to none of it
SLOW_LIMIT_FACTOR = 10  # a process silent this many limits is ended, slow or not


@dataclass(frozen=True)
class Activity:
    """What a process did since the previous reading."""

    ran_s: float = 0.0  # CPU time its threads used, summed
    waited_s: float = 0.0  # the longest a thread of it waited on a run queue
    states: str = ""  # its threads' states at this reading (R, S, D, T, ...), one letter each

    @property
    def runnable(self) -> bool:
        """A thread of it is running, waiting for a CPU or on the machine (R, D) at this reading."""
        return "R" in self.states or "D" in self.states

    def excused(self, step_s: float) -> float:
        """How much of a silent tick of ``step_s`` (the span of this activity) was slow, not hung."""
        if self.runnable or self.ran_s >= BUSY_SHARE * step_s:
            return step_s
        return min(step_s, self.waited_s)


@dataclass(frozen=True)
class _Reading:
    cpu_s: float  # the process's CPU time so far (user + system)
    waits: dict[str, int]  # tid -> run-queue delay so far (ns)
    states: str


class ProcessActivity:
    """Readings of processes by pid; each ``since`` compares with that pid's previous one."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._last: dict[int, _Reading] = {}
        self._tick_s = 1 / os.sysconf("SC_CLK_TCK")

    def since(self, pid: int) -> Activity:
        """What the process did since the previous call for this pid (nothing, the first time)."""
        now = self._read(pid)
        before = self._last.get(pid)
        self._last[pid] = now
        if before is None:
            return Activity(states=now.states)
        growth = [delay - before.waits[tid] for tid, delay in now.waits.items() if tid in before.waits]
        return Activity(ran_s=max(0.0, now.cpu_s - before.cpu_s), waited_s=max(growth, default=0) / 1e9,
                        states=now.states)

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)

    def _read(self, pid: int) -> _Reading:
        base = f"{self._root}/{pid}"
        try:
            tids = os.listdir(f"{base}/task")
        except OSError:
            return _Reading(0.0, {}, "")
        waits: dict[str, int] = {}
        states = ""
        for tid in tids:
            waits_ns = _run_queue_ns(f"{base}/task/{tid}/schedstat")
            if waits_ns is not None:
                waits[tid] = waits_ns
            states += _state(f"{base}/task/{tid}/stat")
        times = _stat_fields(f"{base}/stat")
        try:
            cpu_s = (int(times[11]) + int(times[12])) * self._tick_s
        except (IndexError, ValueError):
            cpu_s = 0.0
        return _Reading(cpu_s, waits, "".join(sorted(states)))


def _run_queue_ns(path: str) -> int | None:
    """A thread's run-queue delay so far from its schedstat (on-CPU ns, run-queue wait ns, slices)."""
    try:
        with open(path) as file:
            return int(file.read().split()[1])
    except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
        return None


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (which may hold spaces): state first."""
    try:
        with open(path) as file:
            return file.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(path: str) -> str:
    fields = _stat_fields(path)
    return fields[0] if fields else ""


class Silence:
    """One watched process's silence since its last answer, on the watchdog's own clock: each tick
    adds at most two tick periods, so a watchdog whose own loop was held up (a blocked or starved
    server) never counts its own absence as the process's silence."""

    def __init__(self, period_s: float, activity: ProcessActivity | None = None, eager: bool = True) -> None:
        self.period_s = period_s
        self.activity = activity or ProcessActivity()
        # eager: read the process at every tick, so that the first overdue one has a baseline (a
        # reading costs ~50 us a thread: a media worker's few threads, at a limit of a second);
        # else only once its answer is overdue (a stage's many threads, at a limit of seconds)
        self.eager = eager
        self.total_s = 0.0  # since its last answer
        self.hung_s = 0.0  # of which the process was neither busy nor waiting for a CPU
        self._ticked_at: float | None = None
        self.last = Activity()  # the process's activity over the last tick

    @property
    def slow_s(self) -> float:
        return self.total_s - self.hung_s

    def heard(self) -> None:
        """It answered: its silence starts again."""
        self.total_s = self.hung_s = 0.0

    def tick(self, pid: int | None, now: float) -> float:
        """A watchdog tick at ``now`` (monotonic seconds): the process was silent since the last.
        Returns the seconds of it excused (busy or waiting for a CPU) while its answer was overdue
        (none on the first tick after an answer: that one's answer may be on its way)."""
        overdue = self.total_s > 0
        step = 0.0 if self._ticked_at is None else min(now - self._ticked_at, 2 * self.period_s)
        self._ticked_at = now
        if pid is None:
            self.last = Activity()
        elif self.eager or overdue:
            self.last = self.activity.since(pid)
        else:
            self.last = Activity()
            self.activity.forget(pid)  # the next reading is a new baseline
        excused = self.last.excused(step)
        self.total_s += step
        self.hung_s += step - excused
        return excused if overdue else 0.0

    def over(self, limit_s: float) -> bool:
        """Hung longer than the limit, or silent ``SLOW_LIMIT_FACTOR`` limits however slow."""
        return self.hung_s > limit_s or self.total_s > SLOW_LIMIT_FACTOR * limit_s

    def describe(self) -> str:
        slow = f", of which {self.slow_s:.1f} s busy or waiting for a CPU" if self.slow_s >= 0.1 else ""
        states = f"; its threads' states: {self.last.states}" if self.last.states else ""
        return f"{self.total_s:.1f} s{slow}{states}"

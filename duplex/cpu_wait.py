"""How long a process waited for a CPU: Linux's per-thread run-queue delay (``schedstat``).

Below every layer (it imports nothing of duplex), like ``lifecycle``: the runtime's watchdog over
stage processes and the edge's over media workers both ask it, so that a process starved of the
CPU is not taken for a hung one. On a box whose cores a nice-0 engine (a CPU vLLM) keeps busy, a
niced stage process or a media worker can sit runnable for seconds; its I/O thread then answers
no ping, though nothing in it is stuck, and killing it would only fail the calls it serves. A hung
process (stopped, deadlocked, blocked in a call) is not runnable, so its threads wait on no run
queue and its silence counts in full.

``waited(pid)`` is, over the process's threads, the largest growth of run-queue delay since the
previous call for that pid: the thread that waited most held the others up at most that long
(the I/O thread, waiting for the interpreter lock, sleeps while the thread holding it waits).
Where ``/proc/<pid>/task/<tid>/schedstat`` cannot be read (another OS, a kernel without
scheduler statistics) every answer is 0: silence counts in full, as without this module.
"""

from __future__ import annotations

import os


class RunQueueWait:
    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._last: dict[int, dict[str, int]] = {}  # pid -> tid -> run-queue delay (ns) at the last call

    def waited(self, pid: int) -> float:
        """Seconds the process's most delayed thread waited for a CPU since the last call (0 the
        first time, and for threads that are new since then)."""
        now = self._read(pid)
        before = self._last.get(pid, {})
        self._last[pid] = now
        growth = [delay - before[tid] for tid, delay in now.items() if tid in before]
        return max(growth, default=0) / 1e9

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)

    def _read(self, pid: int) -> dict[str, int]:
        tasks = f"{self._root}/{pid}/task"
        try:
            tids = os.listdir(tasks)
        except OSError:
            return {}
        delays = {}
        for tid in tids:
            try:
                with open(f"{tasks}/{tid}/schedstat") as stat:
                    delays[tid] = int(stat.read().split()[1])  # on-CPU ns, run-queue wait ns, timeslices
            except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
                continue
        return delays

"""A process as the kernel's /proc files show it, written under a test's own folder: a
starvation of seconds, or a worker spinning without answering, cannot be made on demand on a
shared box (tests/test_cpu_wait.py checks the reader against the kernel's real files)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # the unit of CPU time in /proc/PID/stat


class FakeProcess:
    """One pid with one thread: its run-queue wait (``schedstat``), its CPU time and its state
    (``stat``). ``run`` moves the counters as the kernel would, for a process that is
    ``waiting`` for a CPU or ``busy`` on one; neither: it is stopped or hung."""

    def __init__(self, root: Path, pid: int) -> None:
        self.root, self.pid = root, pid
        self.waited_s = self.cpu_s = 0.0
        self.waiting = self.busy = False
        self.shown_state: str | None = None  # what its stat says, if not what waiting and busy imply
        (root / str(pid) / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        self.write()

    @property
    def state(self) -> str:
        if self.shown_state is not None:
            return self.shown_state
        return "R" if self.waiting or self.busy else "S"

    def write(self) -> None:
        ticks = int(self.cpu_s / TICK_S)
        stat = f"{self.pid} (python) {self.state} 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0\n"
        base = self.root / str(self.pid)
        (base / "stat").write_text(stat)
        (base / "task" / str(self.pid) / "stat").write_text(stat)
        (base / "task" / str(self.pid) / "schedstat").write_text(f"{int(self.cpu_s * 1e9)} "
                                                                  f"{int(self.waited_s * 1e9)} 0\n")

    def advance(self, seconds: float) -> None:
        if self.waiting:
            self.waited_s += seconds
        if self.busy:
            self.cpu_s += seconds
        self.write()

    async def run(self, every_s: float = 0.02) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(every_s)  # the kernel's counters move continuously; this often is enough
            now = time.monotonic()
            self.advance(now - last)
            last = now

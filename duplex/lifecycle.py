"""A process's life: run until Ctrl-C or SIGTERM, children that die with their parent, and ending a
child in steps. Below every layer (it imports nothing of duplex): the runtime's stage processes and
the edge's media workers are both such children, and the server owns the signals."""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import signal
from contextlib import suppress

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Catches SIGINT/SIGTERM from the moment it is made (make it before announcing readiness,
    or a signal sent right after the announcement kills the process the hard way)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._received: asyncio.Future[signal.Signals] = self._loop.create_future()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._received.done():
            self._received.set_result(sig)

    async def wait(self) -> signal.Signals:
        try:
            return await self._received
        finally:
            self.close()

    def close(self) -> None:
        for sig in STOP_SIGNALS:
            with suppress(Exception):
                self._loop.remove_signal_handler(sig)


def die_with_parent() -> None:
    """Linux: this child gets SIGTERM when its parent dies, so no stage or media worker
    outlives the server."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def yield_cpu(by: int) -> None:
    """Raise the nice of every thread of this process by ``by``. Linux keeps a nice per thread
    and a new thread takes its creator's; threads that imports already started (OpenBLAS's pool
    does the math) would otherwise keep the old one."""
    if by <= 0:
        return
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread, and what it starts from now on
        os.nice(by)
        return
    for tid in threads:
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + by, 19))


def end_process(process: mp.process.BaseProcess, grace_s: float) -> None:
    """Wait ``grace_s`` for a child to end on its own, then SIGTERM, then SIGKILL (2 s each)."""
    process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(2)
    if process.is_alive():
        process.kill()
        process.join(2)

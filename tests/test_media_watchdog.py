"""The media workers' watchdog (``WorkerHandle.unexcused_silence``): a worker's silence spent
waiting for a CPU is excused, a silence spent otherwise is not, read from the kernel's per-thread
``schedstat`` files (written here under a fake /proc: a starvation of seconds cannot be made on
demand on a shared box; tests/test_cpu_wait.py checks the reader against the kernel's own files).
The last test runs a real worker process, stopped, first "waiting for a CPU", then not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from duplex.cpu_wait import RunQueueWait
from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc.media_pool import MediaWorkers, WorkerHandle
from tests.runtime_helpers import wait_for

PID = 4242
PING_S = 0.5  # the pacer pings every 25 frames of 20 ms


def _waited(root: Path, seconds: float, pid: int = PID) -> None:
    path = root / str(pid) / "task" / str(pid) / "schedstat"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"0 {int(seconds * 1e9)} 0\n")


async def test_a_silence_spent_waiting_for_a_cpu_is_excused_and_one_spent_otherwise_is_not(tmp_path: Path):
    handle = WorkerHandle(0, str(tmp_path), 0, EdgeConfig())
    handle.pid, handle.answered_at = PID, 100.0
    handle.run_queue = RunQueueWait(proc_root=str(tmp_path))
    _waited(tmp_path, 0.0)
    assert handle.unexcused_silence(100.5, PING_S) == pytest.approx(0.5)  # its answer is not due yet
    _waited(tmp_path, 1.0)  # of the next second, one spent on a run queue
    assert handle.unexcused_silence(101.5, PING_S) == pytest.approx(0.5)
    _waited(tmp_path, 7.0)  # and all of the next 6 s
    assert handle.unexcused_silence(107.5, PING_S) == pytest.approx(0.5)
    assert handle.starved_s == pytest.approx(7.0)
    # silent 2 s more without waiting for anything (stopped, stuck in a call): it all counts
    assert handle.unexcused_silence(109.5, PING_S) == pytest.approx(2.5)
    # it answered: nothing is overdue and nothing carried over to its next silence
    handle.answered_at = 109.6
    _waited(tmp_path, 20.0)  # waits while it was answering excuse nothing later
    assert handle.unexcused_silence(109.9, PING_S) == pytest.approx(0.3) and handle.starved_s == 0.0
    assert handle.unexcused_silence(111.0, PING_S) == pytest.approx(1.4)


async def test_where_the_counters_cannot_be_read_every_silence_counts(tmp_path: Path):
    handle = WorkerHandle(0, str(tmp_path), 0, EdgeConfig())
    handle.pid, handle.answered_at = PID, 100.0
    handle.run_queue = RunQueueWait(proc_root=str(tmp_path / "absent"))
    assert handle.unexcused_silence(101.5, PING_S) == pytest.approx(1.5)
    assert handle.unexcused_silence(104.0, PING_S) == pytest.approx(4.0)


STALL_S = 1.0  # the watchdog's limit (the smallest the config allows), checked at every ping


class _Counters:
    """A stopped process's run-queue counter under a fake /proc: it moves while ``waiting``, as
    the kernel's does for a process starved of the CPU, and stands still once it is not."""

    def __init__(self, root: Path, pid: int) -> None:
        self.root, self.pid, self.seconds, self.waiting = root, pid, 0.0, True
        _waited(root, 0.0, pid)

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if self.waiting:
                self.seconds += now - last
                _waited(self.root, self.seconds, self.pid)
            last = now


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_stopped_worker_waiting_for_a_cpu_is_kept_and_ended_once_it_waits_for_nothing(tmp_path: Path):
    workers = MediaWorkers(EdgeConfig(media_stall_s=STALL_S), 1)
    await workers.start()
    handle = workers.workers[0]
    assert handle is not None and handle.pid is not None
    pid = handle.pid
    handle.run_queue = RunQueueWait(proc_root=str(tmp_path))
    counters = _Counters(tmp_path, pid)
    writer = asyncio.create_task(counters.run())

    async def starved_long() -> bool:
        return handle.starved_s >= 3 * STALL_S

    async def restarted() -> bool:
        return workers.restarts == 1

    try:
        os.kill(pid, signal.SIGSTOP)  # silent, as a worker starved of the CPU is
        await wait_for(starved_long, timeout=3 * STALL_S + 20, what="three stall limits of waiting for a CPU")
        assert workers.workers[0] is handle and handle.stalled_s is None and workers.restarts == 0  # kept
        counters.waiting = False  # silent, and waiting for nothing: hung
        await wait_for(restarted, timeout=4 * STALL_S + 20, what="the hung worker ended and started again")
        assert handle.stalled_s is not None and handle.stalled_s > STALL_S
    finally:
        writer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await workers.stop()

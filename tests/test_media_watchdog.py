"""The media workers' watchdog (``WorkerHandle.watch``): a worker's silence spent busy or waiting
for a CPU is excused (up to ten limits), a silence spent otherwise is not, and the watchdog's own
absence is nobody's silence; read from the kernel's /proc files (written here under a fake /proc,
``tests/fake_proc.py``). The last test runs a real worker process, stopped, first "waiting for a
CPU", then not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from duplex.cpu_wait import SLOW_LIMIT_FACTOR, ProcessActivity
from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc.media_pool import MediaWorkers, WorkerHandle
from tests.fake_proc import FakeProcess
from tests.runtime_helpers import wait_for

PID = 4242
PING_S = 0.5  # the pacer pings every 25 frames of 20 ms
STALL_S = 1.0  # the watchdog's limit (the smallest the config allows)


def _handle(root: Path) -> WorkerHandle:
    handle = WorkerHandle(0, str(root), 0, EdgeConfig())
    handle.pid = PID
    handle.silence.activity = ProcessActivity(proc_root=str(root))
    return handle


def _ticks(handle: WorkerHandle, process: FakeProcess | None, start: float, count: int) -> tuple[float, bool]:
    """``count`` pings half a second apart from ``start``, the process's counters moving between
    them; returns the time of the last and whether the watchdog called the worker stalled."""
    over = False
    for n in range(1, count + 1):
        if process is not None:
            process.advance(PING_S)
        over = handle.watch(start + n * PING_S, STALL_S)
    return start + count * PING_S, over


async def test_a_silence_spent_waiting_for_a_cpu_or_busy_is_excused_and_one_spent_otherwise_is_not(tmp_path: Path):
    handle, process = _handle(tmp_path), FakeProcess(tmp_path, PID)
    now, over = _ticks(handle, process, 100.0, 1)  # the first reading: its baseline
    process.waiting = True
    now, over = _ticks(handle, process, now, 8)  # 4 s waiting for a CPU
    assert not over and handle.silence.hung_s == 0 and handle.silence.slow_s == pytest.approx(4.0)
    assert handle.slow_s == pytest.approx(3.5)  # what stats show: the first tick's answer was not yet due
    process.waiting, process.busy = False, True
    now, over = _ticks(handle, process, now, 8)  # 4 s busy (a long step that keeps its loop)
    assert not over and handle.silence.hung_s == 0 and handle.silence.slow_s == pytest.approx(8.0)
    process.busy = False  # silent and doing nothing: stopped, or stuck in a call
    now, over = _ticks(handle, process, now, 2)
    assert not over and handle.silence.hung_s == pytest.approx(1.0)
    now, over = _ticks(handle, process, now, 1)
    assert over and handle.silence.hung_s == pytest.approx(1.5)
    assert "8.0 s busy or waiting for a CPU" in handle.silence.describe()
    # it answered: nothing is carried over to its next silence
    handle.silence.heard()
    process.waiting = True
    now, over = _ticks(handle, process, now, 1)
    assert handle.silence.total_s == pytest.approx(PING_S) and handle.silence.hung_s == 0


async def test_a_worker_slow_for_ten_limits_is_ended_however_busy(tmp_path: Path):
    handle, process = _handle(tmp_path), FakeProcess(tmp_path, PID)
    process.busy = True  # a loop that spins and never answers
    ticks = int(SLOW_LIMIT_FACTOR * STALL_S / PING_S)
    now, over = _ticks(handle, process, 100.0, ticks + 1)  # the first tick only sets the baseline
    assert not over and handle.silence.hung_s == 0
    now, over = _ticks(handle, process, now, 1)
    assert over


async def test_the_watchdogs_own_absence_is_not_the_workers_silence(tmp_path: Path):
    handle, process = _handle(tmp_path), FakeProcess(tmp_path, PID)
    now, _ = _ticks(handle, process, 100.0, 1)
    assert handle.watch(now + 30.0, STALL_S) is False  # the server's loop held up 30 s: two ticks' worth
    assert handle.silence.total_s == pytest.approx(2 * PING_S)


async def test_where_proc_cannot_be_read_every_silence_counts(tmp_path: Path):
    handle = WorkerHandle(0, str(tmp_path), 0, EdgeConfig())
    handle.pid = PID
    handle.silence.activity = ProcessActivity(proc_root=str(tmp_path / "absent"))
    now, over = _ticks(handle, None, 100.0, 3)
    assert not over and handle.silence.hung_s == pytest.approx(1.0)
    now, over = _ticks(handle, None, now, 1)
    assert over


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_stopped_worker_waiting_for_a_cpu_is_kept_and_ended_once_it_waits_for_nothing(tmp_path: Path):
    workers = MediaWorkers(EdgeConfig(media_stall_s=STALL_S), 1)
    await workers.start()
    handle = workers.workers[0]
    assert handle is not None and handle.pid is not None
    pid = handle.pid
    handle.silence.activity = ProcessActivity(proc_root=str(tmp_path))
    process = FakeProcess(tmp_path, pid)
    process.waiting = True
    writer = asyncio.create_task(process.run())

    async def starved_long() -> bool:
        return handle.silence.slow_s >= 3 * STALL_S

    async def restarted() -> bool:
        return workers.restarts == 1

    try:
        os.kill(pid, signal.SIGSTOP)  # silent, as a worker starved of the CPU is
        await wait_for(starved_long, timeout=3 * STALL_S + 20, what="three stall limits of waiting for a CPU")
        assert workers.workers[0] is handle and handle.stalled_s is None and workers.restarts == 0  # kept
        assert workers.stats()["late_slow_s"][0] >= 2 * STALL_S  # what /duplex/stats shows
        process.waiting = False  # silent, and waiting for nothing: hung
        await wait_for(restarted, timeout=4 * STALL_S + 20, what="the hung worker ended and started again")
        assert handle.stalled_s is not None and handle.stalled_s > STALL_S
    finally:
        writer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await workers.stop()

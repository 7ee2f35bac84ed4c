"""The media workers' watchdog (``WorkerHandle.unexcused_silence``): a worker's silence spent
waiting for a CPU is excused, a silence spent otherwise is not, read from the kernel's per-thread
``schedstat`` files (written here under a fake /proc: a starvation of seconds cannot be made on
demand on a shared box; tests/test_cpu_wait.py checks the reader against the kernel's own files,
and test_edge_media_workers.py a stopped worker ended by the watchdog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex.cpu_wait import RunQueueWait
from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc.media_pool import WorkerHandle

PID = 4242
PING_S = 0.5  # the pacer pings every 25 frames of 20 ms


def _waited(root: Path, seconds: float) -> None:
    path = root / str(PID) / "task" / str(PID) / "schedstat"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"0 {int(seconds * 1e9)} 0\n")


async def test_a_silence_spent_waiting_for_a_cpu_is_excused_and_one_spent_otherwise_is_not(tmp_path: Path):
    handle = WorkerHandle(0, str(tmp_path), 0, EdgeConfig())
    handle.pid, handle.answered_at = PID, 100.0
    handle.run_queue = RunQueueWait(proc_root=str(tmp_path))
    _waited(tmp_path, 0.0)
    assert handle.unexcused_silence(100.5, PING_S) == pytest.approx(0.5)  # its answer is not due yet
    assert handle.unexcused_silence(101.5, PING_S) == pytest.approx(1.5)  # overdue: the baseline, in full
    _waited(tmp_path, 2.0)  # the next 2 s spent on a run queue
    assert handle.unexcused_silence(103.5, PING_S) == pytest.approx(1.5)
    _waited(tmp_path, 6.0)  # and the 4 s after
    assert handle.unexcused_silence(107.5, PING_S) == pytest.approx(1.5)
    assert handle.starved_s == pytest.approx(6.0)
    # silent 2 s more without waiting for anything (stopped, stuck in a call): it all counts
    assert handle.unexcused_silence(109.5, PING_S) == pytest.approx(3.5)
    # it answered: nothing is overdue and nothing carried over to its next silence
    handle.answered_at = 109.6
    assert handle.unexcused_silence(109.9, PING_S) == pytest.approx(0.3) and handle.starved_s == 0.0
    _waited(tmp_path, 20.0)  # counters that moved while it was answering excuse nothing later
    assert handle.unexcused_silence(111.0, PING_S) == pytest.approx(1.4)


async def test_where_the_counters_cannot_be_read_every_silence_counts(tmp_path: Path):
    handle = WorkerHandle(0, str(tmp_path), 0, EdgeConfig())
    handle.pid, handle.answered_at = PID, 100.0
    handle.run_queue = RunQueueWait(proc_root=str(tmp_path / "absent"))
    assert handle.unexcused_silence(101.5, PING_S) == pytest.approx(1.5)
    assert handle.unexcused_silence(104.0, PING_S) == pytest.approx(4.0)

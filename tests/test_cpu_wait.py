"""How long a process waited for a CPU, read from the kernel's own counters: two busy processes
sharing one core each wait about half the time; a sleeping one waits for nothing; a pid that is
gone reads 0. Real processes, real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from duplex.cpu_wait import RunQueueWait

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
                                reason="needs Linux scheduler statistics (/proc/PID/task/TID/schedstat)")

SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def _children(*argv_lists: list[str]) -> list[subprocess.Popen]:
    return [subprocess.Popen(argv) for argv in argv_lists]


def test_two_busy_processes_on_one_core_each_wait_for_it_and_a_sleeping_one_does_not():
    core = sorted(os.sched_getaffinity(0))[0]
    spinners = _children(*([sys.executable, "-c", SPIN, str(core)] for _ in range(2)))
    sleeper = subprocess.Popen(["sleep", "60"])  # starts in a millisecond, then never runnable
    try:
        reader = RunQueueWait()
        for proc in (*spinners, sleeper):
            assert reader.waited(proc.pid) == 0  # the first reading is the baseline
        began = time.monotonic()
        waits = {proc.pid: 0.0 for proc in (*spinners, sleeper)}
        # two runnable processes on one core: each waits while the other runs, about half of the
        # time; poll until both have waited a second (bounded), the sleeper meanwhile next to nothing
        while min(waits[p.pid] for p in spinners) < 1.0:
            assert time.monotonic() - began < 30, waits
            time.sleep(0.1)  # the span measured, not a synchronisation
            for pid in waits:
                waits[pid] += reader.waited(pid)
        elapsed = time.monotonic() - began
        assert all(waits[p.pid] >= elapsed / 4 for p in spinners), (waits, elapsed)
        assert waits[sleeper.pid] < 0.05 * elapsed, (waits, elapsed)
    finally:
        for proc in (*spinners, sleeper):
            proc.kill()
            proc.wait()


def test_a_process_that_is_gone_or_unreadable_reads_as_no_wait(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    reader = RunQueueWait()
    assert reader.waited(proc.pid) == 0 and reader.waited(proc.pid) == 0
    (tmp_path / "7" / "task" / "7").mkdir(parents=True)
    (tmp_path / "7" / "task" / "7" / "schedstat").write_text("garbage\n")
    assert RunQueueWait(proc_root=str(tmp_path)).waited(7) == 0

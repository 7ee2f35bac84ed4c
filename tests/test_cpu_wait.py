"""What a silent process did, read from the kernel's own files (real processes, real /proc): two
busy processes sharing one core each ran and waited for it about half the time, and a tick of
theirs is excused in full; a sleeping process and a stopped one did neither, and no tick of theirs
is excused; a pid that is gone, or files that cannot be read, excuse nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from duplex.cpu_wait import ProcessActivity, Silence
from tests.fake_proc import FakeProcess

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
                                reason="needs Linux scheduler statistics (/proc/PID/task/TID/schedstat)")

SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def test_busy_processes_sharing_a_core_ran_and_waited_and_a_sleeping_or_stopped_one_did_neither():
    core = sorted(os.sched_getaffinity(0))[0]
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(core)]) for _ in range(2)]
    sleeper = subprocess.Popen(["sleep", "60"])  # starts in a millisecond, then never runnable
    stopped = subprocess.Popen([sys.executable, "-c", SPIN, str(core)])
    os.kill(stopped.pid, signal.SIGSTOP)
    everyone = (*spinners, sleeper, stopped)
    try:
        reader = ProcessActivity()
        for proc in everyone:
            reader.since(proc.pid)  # the first reading is the baseline
        began = time.monotonic()
        ran = {proc.pid: 0.0 for proc in everyone}
        waited = dict(ran)
        runnable = {proc.pid: 0 for proc in everyone}
        readings = 0
        # two runnable processes on one core: each waits while the other runs, about half of the
        # time; poll until both have waited a second (bounded), the others meanwhile next to nothing
        while min(waited[p.pid] for p in spinners) < 1.0:
            assert time.monotonic() - began < 30, waited
            time.sleep(0.1)  # the span measured, not a synchronisation
            readings += 1
            for pid in ran:
                activity = reader.since(pid)
                ran[pid] += activity.ran_s
                waited[pid] += activity.waited_s
                runnable[pid] += activity.runnable
        elapsed = time.monotonic() - began
        for proc in spinners:
            assert ran[proc.pid] >= elapsed / 4 and waited[proc.pid] >= elapsed / 4, (ran, waited, elapsed)
            assert runnable[proc.pid] == readings
        for proc in (sleeper, stopped):
            assert ran[proc.pid] < 0.05 * elapsed and waited[proc.pid] < 0.05 * elapsed, (ran, waited, elapsed)
            assert runnable[proc.pid] == 0
        # a watchdog's tick: a spinner's is excused in full, the sleeper's and the stopped one's not at all
        for proc in everyone:
            reader.since(proc.pid)
        time.sleep(0.5)  # the tick measured
        assert [reader.since(p.pid).excused(0.5) for p in everyone] == [0.5, 0.5, 0.0, 0.0]
    finally:
        for proc in everyone:
            proc.kill()
            proc.wait()


def test_a_process_that_is_gone_or_unreadable_excuses_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    reader = ProcessActivity()
    assert reader.since(proc.pid).excused(0.5) == 0 and reader.since(proc.pid).excused(0.5) == 0
    task = tmp_path / "7" / "task" / "7"
    task.mkdir(parents=True)
    (task / "schedstat").write_text("garbage\n")
    (task / "stat").write_text("garbage\n")
    (tmp_path / "7" / "stat").write_text("7 (x\n")
    garbled = ProcessActivity(proc_root=str(tmp_path))
    assert garbled.since(7).excused(0.5) == 0 and garbled.since(7).excused(0.5) == 0
    silence = Silence(0.5, garbled)
    for n in range(4):
        silence.tick(7, 100.0 + n * 0.5)
    assert silence.hung_s == pytest.approx(1.5) and silence.over(1.0)


def test_a_lazy_silence_reads_the_process_only_once_its_answer_is_overdue(tmp_path):
    process = FakeProcess(tmp_path, 7)
    process.busy = True
    activity = ProcessActivity(proc_root=str(tmp_path))
    silence = Silence(0.5, activity, eager=False)
    reads = []
    since = activity.since
    activity.since = lambda pid: reads.append(pid) or since(pid)  # type: ignore[method-assign]
    for n in range(4):
        process.advance(0.5)
        silence.tick(7, 100.0 + n * 0.5)
    # the first tick sets its clock, the second's answer is not yet due (counted, unread), the
    # third and fourth read it: busy, excused
    assert reads == [7, 7] and silence.hung_s == pytest.approx(0.5) and silence.slow_s == pytest.approx(1.0)
    silence.heard()
    silence.tick(7, 102.0)
    assert reads == [7, 7]  # answered: not read again until overdue

"""Ctrl-C and SIGTERM stop every stage process, unlink every segment, remove every socket file."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from duplex.runtime import shm

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_and_a_restart_works_at_once(sig):
    for _ in range(2):  # the second start proves nothing was left in the way
        proc = subprocess.Popen([sys.executable, "tests/pipeline_until_signal.py", "toy"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            info = json.loads(proc.stdout.readline())
            assert len(info["pids"]) == 3 and all(alive(pid) for pid in info["pids"])
            # Ctrl-C in a terminal signals the whole process group, children included
            os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
            assert proc.wait(timeout=60) == 0
            assert f"stopping on {sig.name}" in proc.stdout.read()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert not [pid for pid in info["pids"] if alive(pid)]
        assert shm.list_segments(shm.run_prefix(info["run_id"])) == []
        assert not os.path.exists(info["run_dir"])


def test_a_coordinator_dropped_without_shutdown_does_not_hang_its_process_when_collected():
    # a caller that fails half-way leaves its coordinator to the garbage collector: that must
    # not block the process (a context terminated while its sockets are open waits for ever)
    proc = subprocess.Popen([sys.executable, "tests/pipeline_dropped.py", "toy"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert "collected" in out, f"the collection hung (or failed): {out!r}"
    assert proc.returncode == 0

"""POSIX shared-memory segments under /dev/shm, named so that a run's leftovers can be found.

We open /dev/shm files directly instead of multiprocessing.shared_memory: its resource tracker
unlinks segments that a consumer merely attached when that consumer exits (Python 3.11).
Name: ``duplex.<run_id>.<owner>.<n>``; ``run_id`` starts with the coordinator's pid so stale
segments of a dead run can be swept at the next start.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "duplex."


class Segment:
    def __init__(self, name: str, size: int, create: bool) -> None:
        self.name = name
        self.size = size
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                self.size = size = os.fstat(fd).st_size
            self.buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        segment = cls(name, size, create=True)
        segment.prefault()
        return segment

    @classmethod
    def attach(cls, name: str) -> Segment:
        return cls(name, 0, create=False)

    def prefault(self) -> None:
        """Touch every page once so the first real transfer does not pay for page faults."""
        step = mmap.PAGESIZE
        for offset in range(0, self.size, step):
            self.buf[offset] = 0

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            pass  # views of it are still alive; the mapping goes when they do

    def unlink(self) -> None:
        try:
            os.unlink(SHM_DIR / self.name)
        except FileNotFoundError:
            pass


def run_prefix(run_id: str) -> str:
    return f"{PREFIX}{run_id}."


def list_segments(prefix: str = PREFIX) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(prefix + "*"))


def _unlink(name: str) -> bool:
    try:
        os.unlink(SHM_DIR / name)
        return True
    except FileNotFoundError:
        return False


def sweep(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; returns how many."""
    return sum(_unlink(name) for name in list_segments(prefix))


def sweep_dead_runs() -> int:
    """Unlink segments left by runs whose coordinator process no longer exists."""
    def dead(name: str) -> bool:
        pid_part = name[len(PREFIX):].split("-", 1)[0]
        return pid_part.isdigit() and not _pid_alive(int(pid_part))

    return sum(_unlink(name) for name in list_segments() if dead(name))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""The scheduler contract: what a stage's I/O shell talks to.

A scheduler owns one stage's computation. The shell (``stage_host``) feeds ``inbox`` with
``WorkItem``s, ships the ``Emit``s the scheduler puts in its ``outbox`` (in the scheduler's
thread), and calls ``abort``. The shell never asks which kind of scheduler it holds; every kind
honours this contract.

Threading: ``start()`` runs the scheduler's loop in its own thread. ``abort()`` and ``stats()``
are called from the shell's thread: ``abort`` only enqueues, the loop frees state between steps,
so a step in flight never has its state freed under it.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from duplex.runtime.contract import CLIENT, Emit, ErrorCode, StageError, WorkItem
from duplex.runtime.step_stats import StepTimes
from duplex.runtime.wakeup import WakePipe

__all__ = ["CLIENT", "AbortCommand", "Emit", "Outbox", "Scheduler", "Wake", "WorkItem"]

# The work items and emits are the runtime's public contract (models import them from there).


@dataclass(frozen=True)
class AbortCommand:
    request_id: str


@dataclass(frozen=True)
class Wake:
    """Put on a scheduler's inbox by its own helpers (a step's compute finished): wakes the loop."""


class Outbox:
    """Where a scheduler's emits go, from the scheduler's own thread.

    A stage host ships each emit in the putting thread (``ship_in_caller``): the output's bytes
    are still hot in that core's cache, and no thread has to wake before they are shipped.
    Without a shipper (a test or a bench driving a scheduler in process) emits queue here for
    ``drain``, and each ``put`` writes a byte to a pipe (``wake_fd``) the driver polls.

    A scheduler whose loop died says so with ``crashed``, not with an emit: ``crash`` holds the
    error and ``wake_fd`` becomes readable, whichever way the emits go.
    """

    def __init__(self) -> None:
        self._items: deque[Emit] = deque()
        self._wake = WakePipe()
        self._ship: Callable[[Emit], None] | None = None
        self.crash: StageError | None = None

    @property
    def wake_fd(self) -> int:
        return self._wake.fd

    def ship_in_caller(self, ship: Callable[[Emit], None]) -> None:
        """From now on ``put`` hands every emit to ``ship`` in the putting thread (so ``put``
        may wait while the host's lock is held)."""
        self._ship = ship

    def put(self, emit: Emit) -> None:
        ship = self._ship
        if ship is not None:
            ship(emit)
            return
        self._items.append(emit)
        self._wake.wake()

    def crashed(self, error: StageError) -> None:
        self.crash = error
        self._wake.wake()

    def drain(self) -> list[Emit]:
        self._wake.clear()
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items

    def close(self) -> None:
        self._wake.close()


class Scheduler(ABC):
    """Base of every scheduler kind: inbox, outbox, a loop thread, abort and stats."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inbox: queue.Queue[WorkItem | AbortCommand | Wake | None] = queue.Queue()
        self.outbox = Outbox()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.step_times = StepTimes()  # observed by the kind's compute (``StepTrace``), read with the stats

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_loop, name=f"sched-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.outbox.close()

    def abort(self, request_id: str) -> None:
        self.inbox.put(AbortCommand(request_id))

    def _run_loop(self) -> None:
        try:
            self.run()
        except Exception as exc:  # a scheduler bug must surface, not hang the stage silently
            self.outbox.crashed(StageError(ErrorCode.STAGE_CRASHED, f"scheduler crashed: {exc!r}", self.name))
            raise

    @abstractmethod
    def run(self) -> None:
        """The loop: take inbox items, compute, put emits; return when stopping."""

    @abstractmethod
    def live_requests(self) -> set[str]:
        """Request ids this scheduler holds any state for (safe to call from another thread)."""

    @abstractmethod
    def resources(self) -> dict[str, int]:
        """Resources held, by kind (e.g. ``kv_slots``, ``feedback_rows``, ``queued_items``)."""

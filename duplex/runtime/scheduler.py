"""The scheduler contract: what a stage's I/O shell talks to.

A scheduler owns one stage's computation. The shell (``stage_host``) feeds ``inbox`` with
``WorkItem``s, drains ``outbox`` of ``Emit``s, and calls ``abort``. The shell never asks which
kind of scheduler it holds; every kind honours this contract.

Threading: ``start()`` runs the scheduler's loop in its own thread. ``abort()`` and ``stats()``
are called from the shell's thread: ``abort`` only enqueues, the loop frees state between steps,
so a step in flight never has its state freed under it.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from duplex.runtime.wakeup import WakePipe

CLIENT = "client"  # the ``source`` of inputs that come from the coordinator (user audio, text)


@dataclass
class WorkItem:
    """One input for one request, in the order its source produced it."""

    request_id: str
    source: str  # upstream stage name, or CLIENT
    data: Any
    eos: bool  # True on the last input this stage gets for the request (all sources ended)
    params: dict = field(default_factory=dict)  # request parameters (session id, sampling, ...)


@dataclass
class Emit:
    """One output for one request. ``eos`` marks the stage's last output for it.

    ``error`` set means the request failed in this stage (the shell reports it and forgets the
    request); ``data`` is then ignored.
    """

    request_id: str
    data: Any = None
    eos: bool = False
    error: str | None = None


@dataclass(frozen=True)
class AbortCommand:
    request_id: str


class Outbox:
    """Thread-safe queue from a scheduler thread to the shell's I/O loop.

    Each ``put`` also writes a byte to a pipe whose read end the shell polls, so the I/O loop
    wakes at once instead of polling on a timer. A shell may instead take emits in the putting
    thread (``take_in_caller``): the output's bytes are still hot in that core's cache, and no
    thread has to wake before they are shipped.
    """

    def __init__(self) -> None:
        self._items: deque[Emit] = deque()
        self._wake = WakePipe()
        self._taker: Callable[[Emit], bool] | None = None

    @property
    def wake_fd(self) -> int:
        return self._wake.fd

    def take_in_caller(self, taker: Callable[[Emit], bool]) -> None:
        """From now on ``put`` hands each emit to ``taker`` in the putting thread (so ``put`` may
        wait while the shell holds its lock); an emit it declines (returns False for) is queued
        for the I/O loop as before."""
        self._taker = taker

    def put(self, emit: Emit) -> None:
        taker = self._taker
        if taker is not None and taker(emit):
            return
        self._items.append(emit)
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
        self.inbox: queue.Queue[WorkItem | AbortCommand | None] = queue.Queue()
        self.outbox = Outbox()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._abort_callbacks: list[Callable[[str], None]] = []

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

    def register_abort_callback(self, callback: Callable[[str], None]) -> None:
        """Called (in the scheduler thread) with the request id whenever a request is aborted."""
        self._abort_callbacks.append(callback)

    def _run_abort_callbacks(self, request_id: str) -> None:
        for callback in self._abort_callbacks:
            callback(request_id)

    def _run_loop(self) -> None:
        try:
            self.run()
        except Exception as exc:  # a scheduler bug must surface, not hang the stage silently
            self.outbox.put(Emit(request_id="*", error=f"scheduler {self.name} crashed: {exc!r}"))
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

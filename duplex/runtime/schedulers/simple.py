"""``simple``: get -> fn -> put, with optional batching (max batch size, max wait).

The computation is ``fn(items, states) -> outputs per item`` (see ``BatchComputation``). A
batch never holds two items of one request, so per-request state is touched by one row at a
time; ``batch_key`` (optional) keeps rows of one batch alike (e.g. same chunk length).

A failed batch is retried row by row, so one bad row fails alone. Computations change a row's
state as they go (append the audio, push the text), before the call that fails, so the scheduler
snapshots each row's state before a call with more than one row and restores it before the
retry: a good row's input counts once.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from duplex.config.pipeline import SimpleSchedulerConfig, StageConfig
from duplex.runtime.contract import ErrorCode, StageError
from duplex.runtime.scheduler import AbortCommand, Emit, Scheduler, Wake, WorkItem
from duplex.runtime.steptrace import StepTrace

log = logging.getLogger("duplex.scheduler")


class BatchComputation(Protocol):
    """``states[i]`` is request ``items[i].request_id``'s own dict, kept between its items. It
    holds plain data (arrays, numbers, small objects) that ``copy.deepcopy`` can snapshot."""

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]: ...


class SimpleScheduler(Scheduler):
    def __init__(self, stage: StageConfig, computation: Callable[..., list[list[Any]]]) -> None:
        super().__init__(stage.name)
        if not isinstance(stage.scheduler, SimpleSchedulerConfig):
            raise TypeError(f"stage {stage.name}: SimpleScheduler needs a simple scheduler config")
        self._cfg = stage.scheduler
        self._fn = computation
        self._batch_key: Callable[[WorkItem], Hashable] | None = getattr(computation, "batch_key", None)
        self._waiting: deque[WorkItem] = deque()
        self._states: dict[str, dict] = {}
        self._last_served: dict[str, int] = {}  # request -> number of the batch that last took one of its items
        self._batch_count = 0
        self._aborted_in_batch: set[str] = set()
        self._lock = threading.Lock()  # guards _waiting/_states for stats readers
        self._trace = StepTrace(stage.name, self.step_times)
        self._batches_alone = False  # set once a state could not be snapshot

    # -- stats (any thread) -------------------------------------------------------------------
    def live_requests(self) -> set[str]:
        with self._lock:
            return set(self._states) | {item.request_id for item in self._waiting}

    def resources(self) -> dict[str, int]:
        with self._lock:
            return {"queued_items": len(self._waiting), "request_states": len(self._states)}

    def abort(self, request_id: str) -> None:
        """Forget the request now, from the caller's thread, not after the batch in flight (whose
        outputs for it the shell drops). The loop still runs the abort callbacks."""
        self._drop(request_id)
        super().abort(request_id)

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping.is_set():
            if not self._collect(block=not self._waiting):
                return
            # no local name for the batch: its inputs (maybe shm views) must die before we block
            self._process(self._next_batch())

    def _collect(self, block: bool) -> bool:
        """Move inbox entries into the waiting line; False once told to stop.

        With ``max_wait_ms`` the first arrival opens a window in which more rows may join. Only
        this thread takes from the inbox, so ``empty()`` is a safe test, and on a core that just
        woke up a far cheaper one than ``get_nowait``'s exception."""
        if not block and self.inbox.empty():
            return True
        entry = self.inbox.get()
        window = self._cfg.max_wait_ms / 1000
        deadline = time.monotonic() + window if window > 0 else None
        while True:
            if entry is None:
                return False
            self._accept(entry)
            if not self.inbox.empty():
                entry = self.inbox.get_nowait()
                continue
            if deadline is None or len(self._waiting) >= self._cfg.max_batch_size:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            try:
                entry = self.inbox.get(timeout=remaining)
            except queue.Empty:
                return True

    def _accept(self, entry: WorkItem | AbortCommand | Wake) -> None:
        if isinstance(entry, AbortCommand):
            self._forget(entry.request_id)
            return
        if isinstance(entry, Wake):
            return
        with self._lock:
            self._waiting.append(entry)

    def _next_batch(self) -> list[WorkItem]:
        """Up to ``max_batch_size`` rows, each the oldest waiting item of a different request
        (a request's items stay in order): last items first (a final transcript ends a turn:
        it is on the caller's critical path), then requests served longest ago, so one
        request's backlog (a reply's words, all queued at once) cannot starve another's."""
        with self._lock:
            heads: dict[str, WorkItem] = {}
            for item in self._waiting:
                heads.setdefault(item.request_id, item)
            batch: list[WorkItem] = []
            key = None
            for item in sorted(heads.values(), key=self._priority):
                if len(batch) == self._cfg.max_batch_size:
                    break
                item_key = self._batch_key(item) if self._batch_key else None
                if not batch or item_key == key:  # a row of another key waits for a batch of its own
                    batch.append(item)
                    key = item_key
            chosen = {id(item) for item in batch}
            self._waiting = deque(item for item in self._waiting if id(item) not in chosen)
            self._batch_count += 1
            for item in batch:
                self._states.setdefault(item.request_id, {})
                self._last_served[item.request_id] = self._batch_count
        return batch

    def _priority(self, head: WorkItem) -> tuple[bool, int]:
        return not head.eos, self._last_served.get(head.request_id, -1)

    def _process(self, batch: list[WorkItem]) -> None:
        if not batch:
            return
        with self._lock:  # a request aborted since _next_batch has no state left: skip it
            batch = [item for item in batch if item.request_id in self._states]
            states = [self._states[item.request_id] for item in batch]
        if not batch:
            return
        before = self._snapshot(states) if len(batch) > 1 else None  # only such a call is retried
        if len(batch) > 1 and before is None:
            for item in batch:  # alone, a row needs no snapshot
                self._process([item])
            return
        t0 = time.monotonic()
        try:
            outputs = self._fn(batch, states)
            self._trace.record([item.request_id for item in batch], t0, time.monotonic(),
                               eos=[item.eos for item in batch])
            if len(outputs) != len(batch):
                raise RuntimeError(f"returned {len(outputs)} outputs for {len(batch)} items")
        except Exception as exc:
            if before is not None:
                # One bad row must not fail its batch mates: run each alone, from the state it
                # had before the failed call, so only the rows that fail by themselves fail.
                self._restore(batch, before)
                for item in batch:
                    self._process([item])
                return
            self.outbox.put(Emit(batch[0].request_id, error=StageError(ErrorCode.STAGE_FAILED, repr(exc), self.name)))
            self._forget(batch[0].request_id)
            return
        for item, produced in zip(batch, outputs):
            self._emit(item, list(produced))

    def _snapshot(self, states: list[dict]) -> list[dict] | None:
        """Copies of the rows' states, or None if one cannot be copied (the computation broke
        the plain-data rule: its rows then run one at a time, which is slower but exact)."""
        if self._batches_alone:
            return None
        try:
            return [copy.deepcopy(state) for state in states]
        except Exception as exc:  # any copy failure means the same: do not batch
            log.warning("%s: request state cannot be copied (%r); rows run one at a time", self.name, exc)
            self._batches_alone = True
            return None

    def _restore(self, batch: list[WorkItem], before: list[dict]) -> None:
        with self._lock:
            for item, state in zip(batch, before):
                if item.request_id in self._states:  # not aborted during the failed call
                    self._states[item.request_id] = state

    def _emit(self, item: WorkItem, produced: list[Any]) -> None:
        # A request aborted while its batch ran still has its outputs put here: the shell
        # tombstoned it before calling abort(), so it drops (and counts) them.
        if not item.eos:
            for data in produced:
                self.outbox.put(Emit(item.request_id, data))
            return
        last = produced.pop() if produced else None
        for data in produced:
            self.outbox.put(Emit(item.request_id, data))
        self.outbox.put(Emit(item.request_id, last, eos=True))
        with self._lock:
            self._states.pop(item.request_id, None)
            self._last_served.pop(item.request_id, None)

    def _forget(self, request_id: str) -> None:
        self._drop(request_id)

    def _drop(self, request_id: str) -> None:
        with self._lock:
            self._waiting = deque(i for i in self._waiting if i.request_id != request_id)
            self._states.pop(request_id, None)
            self._last_served.pop(request_id, None)

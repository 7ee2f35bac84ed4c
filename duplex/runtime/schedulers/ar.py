"""``ar``: continuous batching over a fixed pool of KV slots, with one-step lookahead.

The scheduler knows requests, slots and steps; the model runner (``StepRunner``) knows tensors.
Each loop iteration:

1. admit waiting requests while slots are free (capacity = min(max_running_requests, the
   runner's slots, which it sized from the stage's memory budget));
2. plan step N over every live row the runner says is ready and start its compute, if fewer
   than two steps are in flight (one without lookahead);
3. resolve, in order, the steps whose compute is done, and emit their outputs;
4. free the slots of requests that finished or were aborted, once allowed (below);
5. take inbox entries: inputs are fed to the runner (or queued while the request waits for a
   slot), aborts retire the request. The loop blocks only when it can do nothing else, and a
   finished compute wakes it like an inbox entry does, so an abort is handled at once, never
   after the step in flight.

Lookahead guard: a row that finished or was aborted is never planned again; a step already in
flight that contains it still runs and its outputs for that row are dropped (they are matched to
rows by request id, not slot). A finished row's slot is released after the last step in flight
that holds it resolves. An aborted row's slot is released at once when the runner declares
``releases_in_flight``: its ``resolve`` skips rows it did not plan, its ``open`` leaves tensor
state to the next compute (the single worker runs steps in order, so a new owner's first step
runs after the old owner's step in flight), and stale K/V past a new owner's positions is never
attended to. Either way each slot is released exactly once (``SlotPool`` raises otherwise).

With ``lookahead`` the compute runs on one worker thread, so step N computes while step N-1's
outputs are shipped (torch releases the GIL); without it each step resolves before the next.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from duplex.config.pipeline import (
    ARSchedulerConfig,
    FeedbackARSchedulerConfig,
    SimpleSchedulerConfig,
    StageConfig,
    StreamSchedulerConfig,
)
from duplex.runtime.contract import ErrorCode, StageError, StepRunner
from duplex.runtime.ended import EndedRequests
from duplex.runtime.scheduler import AbortCommand, Emit, Scheduler, Wake, WorkItem
from duplex.runtime.schedulers.slot_pool import SlotPool
from duplex.runtime.steptrace import StepTrace

GIL_SWITCH_S = 0.0005
_STEP_DONE = Wake()  # put on the inbox when a step's compute finishes


# RowOutput and StepRunner are the runtime's public contract (``duplex.runtime.contract``).


@dataclass
class _Row:
    request_id: str
    slot: int
    done: bool = False


@dataclass
class _Step:
    owners: dict[int, str]  # slot -> request id when planned
    plan: Any
    result: Future

    @property
    def slots(self) -> list[int]:
        return list(self.owners)


class ARScheduler(Scheduler):
    config_type: type = ARSchedulerConfig

    def __init__(self, stage: StageConfig, runner: StepRunner) -> None:
        super().__init__(stage.name)
        cfg = stage.scheduler
        if not isinstance(cfg, self.config_type) or isinstance(cfg, (SimpleSchedulerConfig, StreamSchedulerConfig)):
            raise TypeError(f"stage {stage.name}: {type(self).__name__} needs a {self.config_type.__name__}")
        self._cfg = cfg
        self.runner = runner
        self._pool = SlotPool(min(self._cfg.max_running_requests, runner.capacity))
        self._waiting: OrderedDict[str, list[WorkItem]] = OrderedDict()
        self._rows: dict[str, _Row] = {}
        self._closing: dict[int, str] = {}  # slot -> request id, released after the step in flight
        self._forgotten: EndedRequests[None] = EndedRequests()  # so late inputs are dropped, not revived
        self._outstanding: list[_Step] = []  # launched, not yet resolved (at most two)
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"step-{stage.name}") if self._cfg.lookahead else None
        self._trace = StepTrace(stage.name, self.step_times)

    # -- stats (any thread) -------------------------------------------------------------------
    def live_requests(self) -> set[str]:
        with self._lock:
            return set(self._waiting) | set(self._rows) | set(self._closing.values())

    def resources(self) -> dict[str, int]:
        with self._lock:
            held = {
                "kv_slots": self._pool.in_use,
                "queued_items": sum(len(items) for items in self._waiting.values()),
            }
            held.update(self.runner.held())
            return held

    def start(self) -> None:
        if self._executor is not None:
            # Compute (worker) and shipping (this loop thread ships its own outputs) share the GIL.
            # Tiny CPU models run mostly Python between torch ops, so at the default 5 ms switch
            # interval a step in flight delays the previous step's outputs by up to 5 ms per
            # hand-off; 0.5 ms bounds that at a negligible switching cost.
            sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        super().start()

    def stop(self) -> None:
        super().stop()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        depth = 2 if self._executor is not None else 1
        while not self._stopping.is_set():
            self._admit()
            if len(self._outstanding) < depth:
                step = self._launch(self._ready_rows())
                if step is not None:
                    self._outstanding.append(step)
            while self._outstanding and self._outstanding[0].result.done():
                self._finish(self._outstanding.pop(0))
            self._release_closing()
            self._admit()  # slots released just now may take waiting requests
            stuck = not (self._outstanding and self._outstanding[0].result.done()) and not (
                len(self._outstanding) < depth and self._ready_rows())
            if not self._intake(block=stuck):
                return

    def _intake(self, block: bool) -> bool:
        while True:
            if not block and self.inbox.empty():  # only this thread takes from it; no exception
                return not self._stopping.is_set()
            try:
                entry = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                if block and not self._stopping.is_set():
                    continue
                return not self._stopping.is_set()
            if entry is None:
                return False
            if isinstance(entry, AbortCommand):
                self._abort(entry.request_id)
            elif isinstance(entry, WorkItem):
                self._accept(entry)
            block = False

    def _accept(self, item: WorkItem) -> None:
        rid = item.request_id
        if rid in self._forgotten:
            return  # inputs still in flight for a request this stage already ended
        row = self._rows.get(rid)
        if row is None:
            with self._lock:
                self._waiting.setdefault(rid, []).append(item)
            return
        self._feed(row, item)

    def _feed(self, row: _Row, item: WorkItem) -> None:
        if row.done:
            return
        try:
            self.runner.feed(row.slot, item.source, item.data, item.eos)
        except ValueError as exc:
            self._end(row, Emit(row.request_id, error=StageError(ErrorCode.BAD_INPUT, str(exc), self.name)))

    def _admit(self) -> None:
        while self._waiting and self._pool.free:
            with self._lock:
                rid, items = self._waiting.popitem(last=False)
                row = _Row(rid, self._pool.allocate(rid))
                self._rows[rid] = row
            self.runner.open(row.slot, rid, items[0].params)
            for item in items:
                self._feed(row, item)

    def _ready_rows(self) -> list[int]:
        return [row.slot for row in self._rows.values() if not row.done and self.runner.ready(row.slot)]

    def _launch(self, slots: list[int]) -> _Step | None:
        if not slots:
            return None
        owners = {row.slot: row.request_id for row in self._rows.values() if row.slot in slots}
        try:
            plan = self.runner.plan(slots)
        except Exception as exc:  # a planning bug fails these rows, never the stage
            self._fail_rows(owners, f"planning failed: {exc!r}")
            return None
        if self._executor is None:
            return _Step(owners, plan, self._compute_now(plan, list(owners.values())))
        future = self._executor.submit(self._compute, plan, list(owners.values()))
        future.add_done_callback(lambda _: self.inbox.put(_STEP_DONE))
        return _Step(owners, plan, future)

    def _compute(self, plan: Any, rids: list[str]) -> Any:
        t0 = time.monotonic()
        raw = self.runner.compute(plan)
        self._trace.record(rids, t0, time.monotonic())
        return raw

    def _compute_now(self, plan: Any, rids: list[str]) -> Future:
        future: Future = Future()
        try:
            future.set_result(self._compute(plan, rids))
        except Exception as exc:  # reported per row in _finish
            future.set_exception(exc)
        return future

    def _finish(self, step: _Step) -> None:
        try:
            outputs = self.runner.resolve(step.plan, step.result.result())
        except Exception as exc:  # one failed step fails its rows, never the stage
            self._fail_rows(step.owners, f"step failed: {exc!r}")
            return
        for slot, out in outputs.items():
            row = self._rows.get(step.owners.get(slot, ""))
            if row is None or row.done or row.slot != slot:
                continue  # lookahead guard: finished or aborted while this step was in flight
            for data in out.emits:
                self.outbox.put(Emit(row.request_id, data))
            if out.error is not None:
                self._end(row, Emit(row.request_id, error=StageError(ErrorCode.STAGE_FAILED, out.error, self.name)))
            elif out.done:
                self._end(row, Emit(row.request_id, out.final, eos=True))

    def _fail_rows(self, owners: dict[int, str], reason: str) -> None:
        for rid in owners.values():
            row = self._rows.get(rid)
            if row is not None and not row.done:
                self._end(row, Emit(row.request_id, error=StageError(ErrorCode.STAGE_FAILED, reason, self.name)))

    def _end(self, row: _Row, emit: Emit) -> None:
        self.outbox.put(emit)
        self._retire(row)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            self._waiting.pop(request_id, None)
        row = self._rows.get(request_id)
        if row is not None and not row.done:
            self._retire(row, at_once=getattr(self.runner, "releases_in_flight", False))
        self._remember(request_id)

    def _retire(self, row: _Row, at_once: bool = False) -> None:
        """No more steps for this row; its slot goes back once no step in flight holds it, or
        now (``at_once``) if the runner tolerates that."""
        row.done = True
        self._remember(row.request_id)
        with self._lock:
            del self._rows[row.request_id]
            self._closing[row.slot] = row.request_id
        self._release_closing(at_once={row.slot} if at_once else set())

    def _release_closing(self, at_once: frozenset[int] | set[int] = frozenset()) -> None:
        busy = {owner for step in self._outstanding for owner in step.owners.items()}
        for slot, rid in list(self._closing.items()):
            if (slot, rid) in busy and slot not in at_once:
                continue
            self.runner.close(slot)
            with self._lock:
                del self._closing[slot]
                self._pool.release(slot, rid)

    def _remember(self, request_id: str) -> None:
        self._forgotten.add(request_id)


class FeedbackARScheduler(ARScheduler):
    """``feedback_ar``: the same loop, for runners whose every step feeds the next one.

    The runner keeps one feedback row per slot (the talker's codec embedding sum for its next
    step) and must report it as ``feedback_rows`` so stats can show it freed; a row becomes ready
    only when both its feedback and its streamed input for that step are there (partial start:
    a request opens on its first upstream chunk, before the upstream has finished).
    """

    config_type = FeedbackARSchedulerConfig

    def __init__(self, stage: StageConfig, runner: StepRunner) -> None:
        super().__init__(stage, runner)
        if "feedback_rows" not in runner.held():
            raise TypeError(f"stage {stage.name}: a feedback_ar runner must report feedback_rows")

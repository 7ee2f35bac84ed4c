"""``stream``: one asyncio task per request, for computations that wait rather than compute.

A stage whose work happens elsewhere (an LLM engine reached over HTTP, which batches requests
itself) needs many requests in flight in one process and an abort that takes effect at once,
not after a step. The runner (``contract.StreamRunner``) gives an async generator per request;
this scheduler runs each on one event loop in the scheduler's thread:

- inputs: a second thread (``intake``) blocks on the inbox and hands each entry to the loop; a
  request's first input starts its task (while fewer than ``max_running_requests`` run, else it
  waits in line), later inputs go to that task's queue;
- outputs: each value the generator yields is emitted as it comes; its return is the request's
  eos; an exception fails the request (``ValueError``: bad input);
- abort: called from the shell's thread, it cancels the task on the loop straight away (no trip
  through the inbox); the runner's ``finally`` closes what it opened. Ended requests are
  remembered so inputs still in flight for them are dropped, never start a new task.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator

from duplex.config.pipeline import StageConfig, StreamSchedulerConfig
from duplex.runtime.contract import ErrorCode, StageError, StreamRunner
from duplex.runtime.ended import EndedRequests
from duplex.runtime.scheduler import AbortCommand, Emit, Scheduler, Wake, WorkItem

log = logging.getLogger("duplex.scheduler")


class _Inputs:
    """One request's inputs as an async iterator that ends after the eos item."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[WorkItem] = asyncio.Queue()
        self._ended = False

    def __aiter__(self) -> AsyncIterator[WorkItem]:
        return self

    async def __anext__(self) -> WorkItem:
        if self._ended:
            raise StopAsyncIteration
        item = await self.queue.get()
        self._ended = item.eos
        return item


class StreamScheduler(Scheduler):
    def __init__(self, stage: StageConfig, runner: StreamRunner) -> None:
        super().__init__(stage.name)
        if not isinstance(stage.scheduler, StreamSchedulerConfig):
            raise TypeError(f"stage {stage.name}: StreamScheduler needs a stream scheduler config")
        self._cap = stage.scheduler.max_running_requests
        self.runner = runner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self._inputs: dict[str, _Inputs] = {}
        self._waiting: OrderedDict[str, list[WorkItem]] = OrderedDict()
        self._ended: EndedRequests[None] = EndedRequests()
        self._lock = threading.Lock()  # guards the dicts for stats readers on other threads
        self._done: asyncio.Event | None = None

    # -- stats (any thread) -------------------------------------------------------------------
    def live_requests(self) -> set[str]:
        with self._lock:
            return set(self._tasks) | set(self._waiting)

    def resources(self) -> dict[str, int]:
        with self._lock:
            held = {"streams": len(self._tasks),
                    "queued_items": sum(len(items) for items in self._waiting.values())
                    + sum(inputs.queue.qsize() for inputs in self._inputs.values())}
        held.update(self.runner.held())
        return held

    def abort(self, request_id: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._abort, request_id)
                return
            except RuntimeError:  # the loop closed in between: nothing is running any more
                pass
        super().abort(request_id)

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        intake = threading.Thread(target=self._intake, name=f"intake-{self.name}", daemon=True)
        try:
            loop.run_until_complete(self._serve(intake))
        finally:
            self._loop = None
            loop.close()

    async def _serve(self, intake: threading.Thread) -> None:
        self._done = asyncio.Event()
        intake.start()
        await self._done.wait()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _intake(self) -> None:
        """Inbox -> loop (a blocking queue cannot be awaited; this thread bridges it)."""
        loop = self._loop
        assert loop is not None and self._done is not None
        while True:
            entry = self.inbox.get()
            if entry is None or self._stopping.is_set():
                loop.call_soon_threadsafe(self._done.set)
                return
            loop.call_soon_threadsafe(self._accept, entry)

    def _accept(self, entry: WorkItem | AbortCommand | Wake) -> None:
        if isinstance(entry, AbortCommand):
            self._abort(entry.request_id)
            return
        if isinstance(entry, Wake):
            return
        rid = entry.request_id
        if rid in self._ended:
            return  # an input still in flight for a request this stage already ended
        inputs = self._inputs.get(rid)
        if inputs is not None:
            inputs.queue.put_nowait(entry)
        elif rid in self._waiting or len(self._tasks) >= self._cap:
            with self._lock:
                self._waiting.setdefault(rid, []).append(entry)
        else:
            self._begin(rid, [entry])

    def _begin(self, rid: str, items: list[WorkItem]) -> None:
        inputs = _Inputs()
        for item in items:
            inputs.queue.put_nowait(item)
        task = asyncio.get_running_loop().create_task(self._drive(rid, items[0], inputs), name=f"{self.name}:{rid}")
        with self._lock:
            self._inputs[rid] = inputs
            self._tasks[rid] = task

    async def _drive(self, rid: str, first: WorkItem, inputs: _Inputs) -> None:
        last: Emit | None = None
        try:
            async for data in self.runner.run(rid, first.params, inputs):
                self.outbox.put(Emit(rid, data))
            last = Emit(rid, None, eos=True)
        except asyncio.CancelledError:
            pass  # aborted: the shell already tombstoned the request; nothing more to say
        except ValueError as exc:
            last = Emit(rid, error=StageError(ErrorCode.BAD_INPUT, str(exc), self.name))
        except Exception as exc:  # the runner's failure fails this request, never the stage
            log.info("%s: request %s failed: %s", self.name, rid, exc)
            last = Emit(rid, error=StageError(ErrorCode.STAGE_FAILED, str(exc) or repr(exc), self.name))
        finally:
            self._forget(rid)  # before the last emit: once the end is out, this stage holds nothing
            if last is not None:
                self.outbox.put(last)
            self._admit()

    def _abort(self, rid: str) -> None:
        self._ended.add(rid)
        with self._lock:
            self._waiting.pop(rid, None)
        task = self._tasks.get(rid)
        if task is not None:
            task.cancel()

    def _forget(self, rid: str) -> None:
        self._ended.add(rid)
        with self._lock:
            self._tasks.pop(rid, None)
            self._inputs.pop(rid, None)

    def _admit(self) -> None:
        while self._waiting and len(self._tasks) < self._cap:
            with self._lock:
                rid, items = self._waiting.popitem(last=False)
            self._begin(rid, items)

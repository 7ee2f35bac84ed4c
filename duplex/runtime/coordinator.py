"""The coordinator: request state, inputs to entry stages, outputs from terminal stages,
abort broadcast and stats. Supervision of the stage processes (restarts, the watchdog, the
stall deadline, a stage that is down) is ``duplex.runtime.supervisor``'s. Runs on an asyncio loop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.asyncio

from duplex.config import check_pipeline
from duplex.config.pipeline import PipelineConfig
from duplex.runtime import messages as m
from duplex.runtime import shm
from duplex.runtime.codec import pack
from duplex.runtime.contract import ErrorCode, OverlapProbe, Request, StageError, TurnRequest
from duplex.runtime.devices import check_devices
from duplex.runtime.ended import EndedRequests
from duplex.runtime.processes import CONTROL, StageProcesses
from duplex.runtime.queries import StageQueries, StageStatsView
from duplex.runtime.relay import Outlet, RelayReader, RelayWriter
from duplex.runtime.requests import OutputChunk, RequestFinished, RequestHandle, RequestState, RequestStatus
from duplex.runtime.scheduler import CLIENT
from duplex.runtime.stage import COORDINATOR
from duplex.runtime.stage_host import Builder, segment_prefix
from duplex.runtime.supervisor import ProcessState, StartError, Supervisor

log = logging.getLogger("duplex.coordinator")
__all__ = ["Coordinator", "StageStatsView", "StartError"]


class Coordinator:
    def __init__(self, pipeline: PipelineConfig, builders: Mapping[str, Builder]) -> None:
        check_pipeline(pipeline, builders)
        self.cfg = pipeline
        self.builders = builders
        self.run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.procs = StageProcesses(pipeline, builders, self.run_id)
        self._requests: dict[str, RequestState] = {}
        self._ended: EndedRequests[RequestStatus] = EndedRequests()
        # The process' one context, never terminated while the process lives: a coordinator that
        # is dropped without shutdown() (a caller's failure) then leaks sockets, where a context of
        # its own would hang the process for good when collected (its __del__ terminates it while
        # the sockets, unreachable in the same collection, are still open)
        self._ctx = zmq.asyncio.Context.instance()
        self._sockets_closed = False
        self._inbox: zmq.asyncio.Socket | None = None
        self._control: zmq.asyncio.Socket | None = None
        self._pushes: dict[str, zmq.asyncio.Socket] = {}
        self._outlet = Outlet(RelayWriter(segment_prefix(self.run_id, CLIENT), pipeline.relay,
                                          use_shm=pipeline.control.transport == "ipc"), self._send)
        self._reader = RelayReader(self._queue_ack, zero_copy_min_bytes=None)  # copy: callers keep data
        self._acks: dict[str, list[int]] = {}
        self.ids = itertools.count(1)  # query ids and ready epochs (the supervisor's too)
        self._queries = StageQueries(self.ids, self.broadcast, self._send)
        self.ready: dict[int, set[str]] = {}  # ready epoch -> stages that answered Hello
        self._tasks: list[asyncio.Task] = []
        self.closing = False
        self.started = False
        self.counters = {status.value: 0 for status in RequestStatus if status.ended}
        self.supervisor = Supervisor(self)

    @property
    def restarts(self) -> int:
        return self.supervisor.restarts

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if any(stage.device != "cpu" for stage in self.cfg.stages):
            # before anything starts: each stage's device exists and the GPU budgets fit (ConfigError)
            await asyncio.get_running_loop().run_in_executor(None, check_devices, self.cfg)
        shm.sweep_dead_runs()
        addresses = self.procs.addresses
        self._inbox = self._socket(zmq.PULL, bind=addresses[COORDINATOR])
        self._control = self._socket(zmq.PUB, bind=addresses[CONTROL])
        self._tasks.append(asyncio.create_task(self._receive_loop(), name="coordinator-recv"))
        try:
            await self.supervisor.start()
        except BaseException:
            await self.shutdown()
            raise
        self.started = True

    async def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        await self.supervisor.stop()
        for state in list(self._requests.values()):
            error = StageError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            self._finish(state, RequestStatus.FAILED, error)
        if self._control is not None:
            self._control.send(m.encode(m.Shutdown()))
        for stage in self.cfg.stages:
            self._send(stage.name, m.Shutdown())
        await asyncio.get_running_loop().run_in_executor(None, self.procs.terminate)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._sockets_closed = True  # from here a late send is dropped: it would open a socket no one closes
        for sock in [self._inbox, self._control, *self._pushes.values()]:
            if sock is not None:
                sock.close(linger=0)
        self._outlet.close()
        self._reader.close()
        shm.sweep(shm.run_prefix(self.run_id))

    async def __aenter__(self) -> Coordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- requests -----------------------------------------------------------------------------
    def submit(self, request: Request | None = None, data: Any = None, eos: bool = False,
               request_id: str | None = None) -> RequestHandle:
        """Open a request (a turn of no session when ``request`` is None). With ``data`` (or
        ``eos``) its first input goes to the entry stages now; otherwise stream inputs with
        ``feed``."""
        if self.closing:
            raise RuntimeError("coordinator is shut down")
        rid = request_id or uuid.uuid4().hex
        if rid in self._requests or rid in self._ended:
            raise ValueError(f"request id {rid!r} already used")
        handle = RequestHandle(rid)
        terminals = set(self.cfg.terminal_stages)
        if isinstance(request, OverlapProbe):  # only the entry stages hear it (runtime/stage.py)
            terminals &= set(self.cfg.entry_stages)
        state = self._requests[rid] = RequestState(rid, request or TurnRequest(session_id=""), handle,
                                                   terminals, touched=self.supervisor.clock)
        down = self.supervisor.down_error()
        if down is not None:  # fail at once, never wait on a stage that is not there
            self._finish(state, RequestStatus.FAILED, down)
        elif not terminals:
            self._finish(state, RequestStatus.FAILED, StageError(
                ErrorCode.BAD_INPUT, f"an overlap probe needs a terminal entry stage; {self.cfg.entry_stages} "
                                     f"are not terminal"))
        elif data is not None or eos:
            self.feed(rid, data, eos=eos)
        return handle

    def feed(self, request_id: str, data: Any, eos: bool = False) -> bool:
        """Stream one input to the entry stages; False if the request has already ended."""
        state = self._requests.get(request_id)
        if state is None:
            return False
        state.touched = self.supervisor.clock
        packed = pack(data) if data is not None else None
        for entry in self.cfg.entry_stages:
            seq = state.input_seq.get(entry, 0)
            state.input_seq[entry] = seq + 1
            msg = m.DataReady(request_id=request_id, src=CLIENT, dst=entry, seq=seq, eos=eos, payload=None,
                              sent_ns=time.monotonic_ns(), params=state.params if seq == 0 else None)
            if packed is None:
                self._send(entry, msg)
            else:
                self._outlet.submit(msg, packed)
        return True

    def abort(self, request_id: str) -> bool:
        """Stop a request in every stage. Idempotent; False if it had already ended."""
        state = self._requests.get(request_id)
        if state is None:
            return False
        self._finish(state, RequestStatus.ABORTED, None)
        return True

    def status(self, request_id: str) -> RequestStatus | None:
        state = self._requests.get(request_id)
        return state.status if state else self._ended.outcome(request_id)

    @property
    def live_requests(self) -> int:
        return len(self._requests)

    def live_states(self) -> list[RequestState]:
        return list(self._requests.values())

    def fail(self, request_id: str, error: StageError) -> bool:
        """End a request with ``error`` (aborted in every stage); False if it had already ended."""
        state = self._requests.get(request_id)
        if state is None:
            return False
        self._finish(state, RequestStatus.FAILED, error)
        return True

    def fail_waiting_on(self, stages: list[str], error: StageError) -> None:
        """Fail every live request that has not yet passed all of ``stages``."""
        for state in list(self._requests.values()):
            if not set(stages) <= state.passed:
                self._finish(state, RequestStatus.FAILED, error)

    def tombstones(self) -> list[str]:
        """Requests that ended other than completed (a restarted stage drops their late inputs)."""
        return [rid for rid, status in self._ended.items() if status is not RequestStatus.COMPLETED]

    def forget_stages(self, stages: list[str]) -> None:
        """A stage process is gone: its segments, the blocks in flight to it, its peers' views."""
        for stage in stages:
            shm.sweep(segment_prefix(self.run_id, stage))
            self._outlet.forget_peer(stage)
            self._reader.forget_segments(segment_prefix(self.run_id, stage))
        self.broadcast(m.PeerRestarted(stages=list(stages)))

    def _finish(self, state: RequestState, status: RequestStatus, error: StageError | None) -> None:
        rid = state.request_id
        self._requests.pop(rid, None)
        self._ended.add(rid, status)
        self.counters[status.value] += 1
        self._outlet.drop_request(rid)
        if status is not RequestStatus.COMPLETED:
            self.broadcast(m.Abort(request_id=rid))
        state.handle.push(RequestFinished(status, error))

    # -- stats and probes ---------------------------------------------------------------------
    async def collect_stats(self, timeout: float = 5.0) -> dict[str, StageStatsView]:
        """Stats of every stage that answers within ``timeout``; stages that are not up (down or
        restarting) are not waited for."""
        assert self._control is not None, "stats() needs a started coordinator"
        states = self.supervisor.stage_states()
        return await self._queries.stats({s for s, state in states.items() if state is ProcessState.UP}, timeout)

    def last_stats(self, stage: str) -> tuple[StageStatsView, float] | None:
        """A stage's last stats reply (one that came after its query's timeout too) and its age in s."""
        return self._queries.last(stage)

    async def stats(self, timeout: float = 5.0) -> dict[str, StageStatsView]:
        """Stats of every stage; TimeoutError naming those that did not answer (down, restarting
        or not answering within ``timeout``)."""
        views = await self.collect_stats(timeout)
        missing = [s.name for s in self.cfg.stages if s.name not in views]
        if missing:
            raise TimeoutError(f"no stats from stages {missing} within {timeout}s")
        return views

    async def wait_idle(self, timeout: float = 5.0, interval: float = 0.005) -> dict[str, StageStatsView]:
        """Poll stats until every stage holds nothing; raise with the last stats if time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            stats = await self.stats()
            if all(view.held == 0 for view in stats.values()):
                return stats
            if time.monotonic() >= deadline:
                raise TimeoutError(f"stages still hold state: {stats}")
            await asyncio.sleep(interval)

    async def ping(self, stage: str, timeout: float = 5.0) -> float:
        """Round trip of a control message to a stage and back, in seconds."""
        return await self._queries.ping(stage, timeout)

    # -- sockets ------------------------------------------------------------------------------
    def _socket(self, kind: int, bind: str | None = None, connect: str | None = None) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if bind:
            sock.bind(bind)
        if connect:
            sock.connect(connect)
        return sock

    def broadcast(self, message: m.Message) -> None:
        if self._control is not None and not self._sockets_closed:
            self._control.send(m.encode(message))

    def send(self, dst: str, message: m.Message) -> None:
        self._send(dst, message)

    def _send(self, dst: str, message: m.Message) -> None:
        if self._sockets_closed:
            return
        sock = self._pushes.get(dst)
        if sock is None:
            sock = self._socket(zmq.PUSH, connect=self.procs.addresses[dst])
            self._pushes[dst] = sock
        sock.send(m.encode(message))

    def _queue_ack(self, producer: str, block_id: int) -> None:
        self._acks.setdefault(producer, []).append(block_id)

    def _flush_acks(self) -> None:
        for producer, block_ids in self._acks.items():
            self._send(producer, m.Ack(consumer=COORDINATOR, block_ids=block_ids))
        self._acks.clear()

    async def _receive_loop(self) -> None:
        assert self._inbox is not None
        while True:
            frame = await self._inbox.recv()
            try:
                self._dispatch(m.decode(frame))
            except Exception:
                log.exception("coordinator: failed to handle a message")
            self._flush_acks()

    def _dispatch(self, msg: m.Message) -> None:
        if isinstance(msg, m.DataReady):
            self._on_output(msg)
        elif isinstance(msg, m.ProgressReports):
            for report in msg.reports:
                self._on_progress(report)
        elif isinstance(msg, m.Ack):
            self._outlet.on_ack(msg.block_ids)
        elif isinstance(msg, m.Ready):
            self.ready.setdefault(msg.epoch, set()).update(msg.stages)
        elif isinstance(msg, (m.StageStats, m.Pong)):
            self._on_reply(msg)

    def _on_reply(self, msg: m.StageStats | m.Pong) -> None:
        if isinstance(msg, m.Pong) and self.supervisor.on_pong(msg):
            return
        self._queries.on_reply(msg)

    def _on_output(self, msg: m.DataReady) -> None:
        state = self._requests.get(msg.request_id)
        if state is None:
            self._reader.discard(msg.payload, msg.src)
            return
        if msg.error is not None:
            self._finish(state, RequestStatus.FAILED, msg.error)
            return
        state.touched = self.supervisor.clock
        data = self._reader.decode(msg.payload, msg.src) if msg.payload is not None else None
        if data is not None or msg.eos:
            state.handle.push(OutputChunk(msg.src, data, msg.eos, time.monotonic_ns()))
        if msg.eos:
            state.terminals_left.discard(msg.src)
            if not state.terminals_left:
                self._finish(state, RequestStatus.COMPLETED, None)

    def _on_progress(self, msg: m.Progress) -> None:
        state = self._requests.get(msg.request_id)
        if state is None:
            return
        state.touched = self.supervisor.clock
        if msg.event == "admitted":
            state.holding.add(msg.stage)
            if state.handle.status is RequestStatus.PENDING:
                state.handle.status = RequestStatus.RUNNING
        else:
            state.holding.discard(msg.stage)
            state.passed.add(msg.stage)

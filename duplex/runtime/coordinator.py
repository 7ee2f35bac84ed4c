"""The coordinator: request state, inputs to entry stages, outputs from terminal stages,
abort broadcast, stats, and supervision of the stage processes. Runs on an asyncio loop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from duplex.config import check_pipeline
from duplex.config.pipeline import PipelineConfig
from duplex.runtime import messages as m
from duplex.runtime import shm
from duplex.runtime.codec import pack
from duplex.runtime.contract import ErrorCode, Request, StageError, TurnRequest
from duplex.runtime.ended import EndedRequests
from duplex.runtime.processes import CONTROL, StageProcesses
from duplex.runtime.relay import Outlet, RelayReader, RelayWriter
from duplex.runtime.requests import OutputChunk, RequestFinished, RequestHandle, RequestState, RequestStatus
from duplex.runtime.scheduler import CLIENT
from duplex.runtime.stage import COORDINATOR
from duplex.runtime.stage_host import Builder, segment_prefix
from duplex.runtime.step_stats import StepHistogram

log = logging.getLogger("duplex.coordinator")


class StartError(RuntimeError):
    pass


@dataclass(frozen=True)
class StageStatsView:
    stage: str
    pid: int
    live_requests: int
    resources: dict[str, int]
    counters: dict[str, int]
    request_ids: list[str]
    steps: StepHistogram | None = None

    @property
    def held(self) -> int:
        """Everything this stage still holds: live requests plus every resource count."""
        return self.live_requests + sum(self.resources.values())


class Coordinator:
    def __init__(self, pipeline: PipelineConfig, builders: Mapping[str, Builder]) -> None:
        check_pipeline(pipeline, builders)
        self.cfg = pipeline
        self.builders = builders
        self.run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.procs = StageProcesses(pipeline, builders, self.run_id)
        self._requests: dict[str, RequestState] = {}
        self._ended: EndedRequests[RequestStatus] = EndedRequests()
        self._ctx = zmq.asyncio.Context()
        self._inbox: zmq.asyncio.Socket | None = None
        self._control: zmq.asyncio.Socket | None = None
        self._pushes: dict[str, zmq.asyncio.Socket] = {}
        self._outlet = Outlet(RelayWriter(segment_prefix(self.run_id, CLIENT), pipeline.relay,
                                          use_shm=pipeline.control.transport == "ipc"), self._send)
        self._reader = RelayReader(self._queue_ack, zero_copy_min_bytes=None)  # copy: callers keep data
        self._acks: dict[str, list[int]] = {}
        self._replies: dict[int, asyncio.Future] = {}
        self._collected: dict[int, dict[str, m.StageStats]] = {}
        self._ids = itertools.count(1)
        self._ready: dict[int, set[str]] = {}
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.started = False
        self.counters = {status.value: 0 for status in RequestStatus if status.ended}
        self.restarts = 0

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        shm.sweep_dead_runs()
        addresses = self.procs.addresses
        self._inbox = self._socket(zmq.PULL, bind=addresses[COORDINATOR])
        self._control = self._socket(zmq.PUB, bind=addresses[CONTROL])
        self._tasks.append(asyncio.create_task(self._receive_loop(), name="coordinator-recv"))
        try:
            for process in self.procs.groups:
                self.procs.spawn(process)
            await self._await_ready(set(self.procs.groups))
        except BaseException:
            await self.shutdown()
            raise
        self._tasks.append(asyncio.create_task(self._watch_processes(), name="coordinator-watch"))
        self.started = True

    async def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
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
        for sock in [self._inbox, self._control, *self._pushes.values()]:
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()
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
        if self._closing:
            raise RuntimeError("coordinator is shut down")
        rid = request_id or uuid.uuid4().hex
        if rid in self._requests or rid in self._ended:
            raise ValueError(f"request id {rid!r} already used")
        handle = RequestHandle(rid)
        self._requests[rid] = RequestState(rid, request or TurnRequest(session_id=""), handle,
                                           set(self.cfg.terminal_stages))
        if data is not None or eos:
            self.feed(rid, data, eos=eos)
        return handle

    def feed(self, request_id: str, data: Any, eos: bool = False) -> bool:
        """Stream one input to the entry stages; False if the request has already ended."""
        state = self._requests.get(request_id)
        if state is None:
            return False
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

    def _finish(self, state: RequestState, status: RequestStatus, error: StageError | None) -> None:
        rid = state.request_id
        self._requests.pop(rid, None)
        self._ended.add(rid, status)
        self.counters[status.value] += 1
        self._outlet.drop_request(rid)
        if status is not RequestStatus.COMPLETED and self._control is not None and not self._ctx.closed:
            self._control.send(m.encode(m.Abort(request_id=rid)))
        state.handle.push(RequestFinished(status, error))

    # -- stats and probes ---------------------------------------------------------------------
    async def stats(self, timeout: float = 5.0) -> dict[str, StageStatsView]:
        assert self._control is not None, "stats() needs a started coordinator"
        query_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._replies[query_id] = future
        collected = self._collected[query_id] = {}
        self._control.send(m.encode(m.StatsQuery(query_id=query_id)))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            self._replies.pop(query_id, None)
            self._collected.pop(query_id, None)
        missing = [s.name for s in self.cfg.stages if s.name not in collected]
        if missing:
            raise TimeoutError(f"no stats from stages {missing} within {timeout}s")
        return {name: StageStatsView(s.stage, s.pid, s.live_requests, dict(s.resources), dict(s.counters),
                                     list(s.request_ids), s.steps)
                for name, s in collected.items()}

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
        query_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._replies[query_id] = future
        self._send(stage, m.Ping(query_id=query_id, sent_ns=time.monotonic_ns()))
        try:
            pong: m.Pong = await asyncio.wait_for(future, timeout)
        finally:
            self._replies.pop(query_id, None)
        return (time.monotonic_ns() - pong.sent_ns) / 1e9

    # -- sockets ------------------------------------------------------------------------------
    def _socket(self, kind: int, bind: str | None = None, connect: str | None = None) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if bind:
            sock.bind(bind)
        if connect:
            sock.connect(connect)
        return sock

    def _send(self, dst: str, message: m.Message) -> None:
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
            self._ready.setdefault(msg.epoch, set()).update(msg.stages)
        elif isinstance(msg, (m.StageStats, m.Pong)):
            self._on_reply(msg)

    def _on_reply(self, msg: m.StageStats | m.Pong) -> None:
        future = self._replies.get(msg.query_id)
        if future is None or future.done():
            return
        if isinstance(msg, m.Pong):
            future.set_result(msg)
            return
        collected = self._collected[msg.query_id]
        collected[msg.stage] = msg
        if len(collected) == len(self.cfg.stages):
            future.set_result(None)

    def _on_output(self, msg: m.DataReady) -> None:
        state = self._requests.get(msg.request_id)
        if state is None:
            self._reader.discard(msg.payload, msg.src)
            return
        if msg.error is not None:
            self._finish(state, RequestStatus.FAILED, msg.error)
            return
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
        if msg.event == "admitted":
            state.holding.add(msg.stage)
            if state.handle.status is RequestStatus.PENDING:
                state.handle.status = RequestStatus.RUNNING
        else:
            state.holding.discard(msg.stage)
            state.passed.add(msg.stage)

    # -- supervision --------------------------------------------------------------------------
    async def _await_ready(self, processes: set[str]) -> None:
        epoch = next(self._ids)
        stages = {s for p in processes for s in self.procs.groups[p]}
        deadline = time.monotonic() + self.cfg.supervision.ready_timeout_s
        assert self._control is not None, "start() binds the control socket first"
        while not stages <= self._ready.get(epoch, set()):
            for process in processes:
                proc = self.procs.procs[process]
                if proc.exitcode is not None:
                    raise StartError(f"stage process {process!r} exited with code {proc.exitcode} while "
                                     f"starting (its log above says why)")
            if time.monotonic() > deadline:
                raise StartError(f"stage processes {sorted(processes)} not ready after "
                                 f"{self.cfg.supervision.ready_timeout_s:.0f}s")
            self._control.send(m.encode(m.Hello(epoch=epoch)))
            await asyncio.sleep(0.02)
        self._ready.pop(epoch, None)

    async def _watch_processes(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            died = asyncio.Event()
            sentinels = [proc.sentinel for proc in self.procs.procs.values()]
            for fd in sentinels:
                loop.add_reader(fd, died.set)
            try:
                await died.wait()
            finally:
                for fd in sentinels:
                    loop.remove_reader(fd)
            for process in self.procs.dead():
                if not self._closing:
                    await self._on_process_died(process)

    async def _on_process_died(self, process: str) -> None:
        proc = self.procs.procs[process]
        stages = self.procs.groups[process]
        reason = f"stage {'/'.join(stages)} (process {process!r}, pid {proc.pid}) died with exit code {proc.exitcode}"
        log.error("%s", reason)
        for state in list(self._requests.values()):
            if not set(stages) <= state.passed:
                self._finish(state, RequestStatus.FAILED, StageError(ErrorCode.STAGE_CRASHED, reason))
        for stage in stages:
            shm.sweep(segment_prefix(self.run_id, stage))
            self._outlet.forget_peer(stage)
            self._reader.forget_segments(segment_prefix(self.run_id, stage))
        assert self._control is not None, "the watcher runs only after start()"
        self._control.send(m.encode(m.PeerRestarted(stages=list(stages))))
        proc.close()
        self.procs.procs.pop(process)
        if not self.cfg.supervision.restart or self.procs.restarts[process] >= self.cfg.supervision.max_restarts:
            log.error("not restarting %s (restarts used: %d)", process, self.procs.restarts[process])
            return
        self.procs.restarts[process] += 1
        self.restarts += 1
        tombstones = [rid for rid, status in self._ended.items() if status is not RequestStatus.COMPLETED]
        self.procs.spawn(process, tombstones=tombstones)
        try:
            await self._await_ready({process})
        except StartError as exc:
            log.error("restart of %s failed: %s", process, exc)
            return
        log.warning("restarted %s", process)

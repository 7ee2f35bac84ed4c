"""A stage process: the I/O shell around one or more (fused) stages' schedulers.

One I/O thread polls every socket and wake-up fd: stage inboxes (PULL), the control broadcast
(SUB), the relay's release queue, held progress reports and the schedulers' crash signals. It
receives: inputs, acks, aborts, queries. Schedulers compute in their own threads.

Outputs have one way out: the scheduler thread that made them ships them (``_ship``: route,
pack, shm write, send) right after computing them, so the bytes are hot in that core's cache and
no thread has to wake first. The host's state (request books, relay, sockets) is touched by one
thread at a time, under ``StageHost.lock``; ZeroMQ lets a socket move between threads across the
full memory barrier a lock gives, and one PUSH socket per destination keeps every destination's
messages in send order. Inputs a locked section accepts for a scheduler are handed over at its
end, so an abort in the same section takes them back first.

A scheduler that crashes sets its outbox's ``crash``; the I/O loop then leaves, closes its
sockets and unlinks its shm segments, and the process exits with status 1 (the coordinator
fails its requests and restarts it).

One file: every method runs under the host's one lock and the thread discipline above; split,
that discipline would be spread over files.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import zmq

from duplex.config.pipeline import PipelineConfig, StageConfig
from duplex.lifecycle import die_with_parent, yield_cpu
from duplex.runtime import messages as m
from duplex.runtime.contract import AgentAudio, BuildContext, Builder, ErrorCode, Request, StageError
from duplex.runtime.devices import budget_bytes, cuda_presence, device_memory, device_problem
from duplex.runtime.ended import EndedRequests
from duplex.runtime.progress import ProgressBuffer
from duplex.runtime.relay import Outlet, RelayReader, RelayWriter
from duplex.runtime.scheduler import CLIENT, Emit, Scheduler, WorkItem
from duplex.runtime.schedulers import make_scheduler
from duplex.runtime.stage import COORDINATOR, StageShell
from duplex.runtime.wakeup import WakePipe

log = logging.getLogger("duplex.stage")


@dataclass
class HostSpec:
    """Everything a stage process needs; pickled into the child at spawn."""

    run_id: str
    process: str
    pipeline: dict
    addresses: dict[str, str]  # stage name / "coordinator" -> inbox; "control" -> broadcast
    tombstones: list[str] = field(default_factory=list)
    use_shm: bool = True




def build_context(pipeline: PipelineConfig, stage: StageConfig) -> BuildContext:
    """What the stage's builder may know of its stage and where it runs."""
    return BuildContext(stage=stage.name, args=dict(stage.args), device=stage.device,
                        memory_bytes=budget_bytes(pipeline, stage), threads=stage.threads,
                        max_running_requests=getattr(stage.scheduler, "max_running_requests", 1))


def segment_prefix(run_id: str, owner: str) -> str:
    return f"duplex.{run_id}.{owner}."


class _ReleaseQueue:
    """Blocks whose last view died, from any thread, to the I/O thread (which sends the acks)."""

    def __init__(self) -> None:
        self.items: deque[tuple[str, int]] = deque()
        self.wake = WakePipe()

    def put(self, producer: str, block_id: int) -> None:
        self.items.append((producer, block_id))
        self.wake.wake()

    def drain(self) -> dict[str, list[int]]:
        self.wake.clear()
        grouped: dict[str, list[int]] = defaultdict(list)
        while self.items:
            producer, block_id = self.items.popleft()
            grouped[producer].append(block_id)
        return grouped


@dataclass
class _HostedStage:
    shell: StageShell
    scheduler: Scheduler
    outlet: Outlet
    reader: RelayReader
    counters: dict[str, int] = field(
        default_factory=lambda: {"admitted": 0, "finished": 0, "aborted": 0, "dropped_late": 0})


class StageHost:
    def __init__(self, spec: HostSpec, builders: Mapping[str, Builder]) -> None:
        self.spec = spec
        self.pipeline = PipelineConfig.model_validate(spec.pipeline)
        self.stages: dict[str, _HostedStage] = {}
        self.releases = _ReleaseQueue()
        self.tombstones: EndedRequests[None] = EndedRequests(spec.tombstones)  # aborted or failed here
        self.ctx = zmq.Context()
        self.pushes: dict[str, zmq.Socket] = {}
        self.inboxes: dict[zmq.Socket, str] = {}
        self.sub: zmq.Socket | None = None
        self.running = True
        self.lock = threading.Lock()  # held by whichever thread touches the host's state
        self._closed = False  # set under the lock: late emits of a stopping scheduler are dropped
        self.progress = ProgressBuffer(lambda reports: self._send(COORDINATOR, reports))
        # inputs accepted in the current locked section, put into scheduler inboxes at its end
        self._handoffs: list[tuple[Scheduler, WorkItem]] = []
        self.crash: StageError | None = None  # set when a scheduler's loop died: the process exits
        self._build(builders)

    # -- setup --------------------------------------------------------------------------------
    def _build(self, builders: Mapping[str, Builder]) -> None:
        device_peers = {s.name for s in self.pipeline.stages if s.device.startswith("cuda")}
        for stage in self.pipeline.processes()[self.spec.process]:
            if stage.device != "cpu" and (problem := device_problem(stage.name, stage.device, *cuda_presence())):
                raise RuntimeError(problem)  # the coordinator checks first; a host can lose a card
            computation = builders[stage.builder](build_context(self.pipeline, stage))
            scheduler = make_scheduler(stage, computation)
            scheduler.outbox.ship_in_caller(partial(self._ship, stage.name))
            writer = RelayWriter(segment_prefix(self.spec.run_id, stage.name), self.pipeline.relay,
                                 use_shm=self.spec.use_shm, device_peers=device_peers)
            outlet = Outlet(writer, self._send)
            reader = RelayReader(self.releases.put)
            self.stages[stage.name] = _HostedStage(StageShell(stage, self.pipeline), scheduler, outlet, reader)

    def _bind(self) -> zmq.Socket:
        for name in self.stages:
            sock = self.ctx.socket(zmq.PULL)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(self.spec.addresses[name])
            self.inboxes[sock] = name
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.spec.addresses["control"])
        self.sub = sub
        return sub

    def _push(self, dst: str) -> zmq.Socket:
        sock = self.pushes.get(dst)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.spec.addresses[COORDINATOR if dst == CLIENT else dst])
            self.pushes[dst] = sock
        return sock

    def _send(self, dst: str, message: m.Message) -> None:
        self._push(dst).send(m.encode(message))

    # -- main loop ----------------------------------------------------------------------------
    def serve(self) -> None:
        """Run the I/O loop until shutdown or a scheduler crash; close everything either way."""
        try:
            sub = self._bind()
            for hosted in self.stages.values():
                hosted.scheduler.start()
            self._loop(sub)
        finally:
            self._close()

    def _loop(self, sub: zmq.Socket) -> None:
        poller, crash_fds = self._poller(sub)
        next_expiry = time.monotonic() + 1.0
        while self.running:
            ready = poller.poll(timeout=self.progress.poll_timeout_ms(200))
            self.progress.awake()
            with self.lock:
                for sock_or_fd, _ in ready:
                    self._on_ready(sock_or_fd, sub, crash_fds)
                    if not self.running:
                        break
                self.progress.flush_due()
                if time.monotonic() >= next_expiry:
                    self._expire_blocks()
                    next_expiry = time.monotonic() + 1.0
                self._hand_off()  # last before sleeping: a woken scheduler thread finds the GIL free

    def _poller(self, sub: zmq.Socket) -> tuple[zmq.Poller, dict[int, str]]:
        poller = zmq.Poller()
        for sock in self.inboxes:
            poller.register(sock, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        # an outbox's pipe carries only its crash signal: every emit is shipped by its producer
        crash_fds = {h.scheduler.outbox.wake_fd: name for name, h in self.stages.items()}
        for fd in crash_fds:
            poller.register(fd, zmq.POLLIN)
        poller.register(self.releases.wake.fd, zmq.POLLIN)
        poller.register(self.progress.wake_fd, zmq.POLLIN)
        return poller, crash_fds

    def _on_ready(self, sock_or_fd: zmq.Socket | int, sub: zmq.Socket, crash_fds: dict[int, str]) -> None:
        if sock_or_fd is sub:
            self._on_broadcast(m.decode(sub.recv()))
        elif sock_or_fd in crash_fds:
            self._on_crash(crash_fds[sock_or_fd])
        elif sock_or_fd == self.releases.wake.fd:
            self._send_acks()
        elif sock_or_fd == self.progress.wake_fd:
            self.progress.on_wake()
        elif isinstance(sock_or_fd, zmq.Socket):  # a stage's inbox
            self._on_inbox(self.inboxes[sock_or_fd], m.decode(sock_or_fd.recv()))

    def _on_broadcast(self, msg: m.Message) -> None:
        if isinstance(msg, m.Abort):
            self._abort(msg.request_id)
        elif isinstance(msg, m.Hello):
            self._send(COORDINATOR, m.Ready(stages=list(self.stages), pid=os.getpid(), epoch=msg.epoch))
        elif isinstance(msg, m.StatsQuery):
            self.progress.flush()  # a stats reply is a sync point: no report still held back
            for name in self.stages:
                self._send(COORDINATOR, self._stats(name, msg.query_id))
        elif isinstance(msg, m.PeerRestarted):
            for hosted in self.stages.values():
                for stage in msg.stages:
                    hosted.outlet.forget_peer(stage)
                    hosted.reader.forget_segments(segment_prefix(self.spec.run_id, stage))
                    hosted.reader.forget_producer(stage)
        elif isinstance(msg, m.Shutdown):
            self.running = False

    def _on_inbox(self, stage: str, msg: m.Message) -> None:
        hosted = self.stages[stage]
        if isinstance(msg, m.DataReady):
            self._on_data(hosted, msg)
        elif isinstance(msg, m.Ack):
            hosted.outlet.on_ack(msg.block_ids)
        elif isinstance(msg, m.Ping):
            self._send(COORDINATOR, m.Pong(query_id=msg.query_id, stage=stage, sent_ns=msg.sent_ns))
        elif isinstance(msg, m.Shutdown):
            self.running = False
        else:
            log.warning("stage %s: unexpected %s on its inbox", stage, type(msg).__name__)

    # -- data in ------------------------------------------------------------------------------
    def _on_data(self, hosted: _HostedStage, msg: m.DataReady) -> None:
        rid = msg.request_id
        if rid in self.tombstones or hosted.shell.finished(rid) or msg.error is not None:
            hosted.reader.discard(msg.payload, msg.src)
            hosted.counters["dropped_late"] += msg.error is None
            if msg.error is not None:
                self._abort(rid)
            return
        try:
            data = hosted.reader.decode(msg.payload, msg.src) if msg.payload is not None else None
        except Exception as exc:  # a corrupt payload fails this request only
            self._fail(hosted, rid, StageError(ErrorCode.BAD_INPUT, f"cannot decode input from {msg.src}: {exc!r}",
                                               hosted.shell.name))
            return
        self._deliver(hosted, rid, msg.src, msg.seq, data, msg.eos, msg.params)

    def _deliver(self, hosted: _HostedStage, rid: str, src: str, seq: int, data: Any, eos: bool,
                 params: Request | None) -> None:
        shell = hosted.shell
        if rid in self.tombstones or shell.finished(rid):
            hosted.counters["dropped_late"] += 1
            return
        first = not shell.knows(rid)
        try:
            items = shell.accept(rid, src, seq, data, eos, params)
        except ValueError as exc:
            self._fail(hosted, rid, StageError(ErrorCode.BAD_INPUT, str(exc), shell.name))
            return
        self._handoffs.extend((hosted.scheduler, item) for item in items)
        if first:
            hosted.counters["admitted"] += 1
            self._report(rid, shell.name, "admitted")

    # -- data out -----------------------------------------------------------------------------
    def _ship(self, stage: str, emit: Emit) -> None:
        """Ship an emit, in the scheduler thread that made it (after ``_close`` it is dropped)."""
        with self.lock:
            if not self._closed:
                self._on_emit(self.stages[stage], emit)
                self._hand_off()  # a fused next stage's inputs

    def _on_crash(self, stage: str) -> None:
        outbox = self.stages[stage].scheduler.outbox
        outbox.drain()  # empties the pipe; nothing is queued there (see ``_ship``)
        if outbox.crash is None:
            return
        log.error("%s", outbox.crash)
        self.crash = outbox.crash
        self.running = False  # the loop leaves, ``serve`` closes, ``host_main`` exits with 1

    def _on_emit(self, hosted: _HostedStage, emit: Emit) -> None:
        if emit.request_id in self.tombstones:
            hosted.counters["dropped_late"] += 1  # aborted while its step ran
        elif emit.error is not None:
            self._fail(hosted, emit.request_id, emit.error)
        else:
            if isinstance(emit.data, AgentAudio):  # for the stage's real-time factor
                hosted.scheduler.step_times.made_audio(emit.data.seconds)
            self._route(hosted, emit)

    def _route(self, hosted: _HostedStage, emit: Emit) -> None:
        shell = hosted.shell
        rid = emit.request_id
        writer = hosted.outlet.writer
        packed: dict[tuple[int, bool], Any] = {}  # pack each routed value once per kind of consumer
        for route in shell.routes(emit):
            seq = shell.next_out_seq(rid, route.dst)
            params = shell.params(rid) if seq == 0 else None
            local = self.stages.get(route.dst)
            if local is not None:  # fused: hand over the object itself
                self._deliver(local, rid, shell.name, seq, route.data, route.eos, params)
                continue
            key = (id(route.data), writer.sends_device(route.dst))
            if key not in packed:
                packed[key] = writer.pack(route.data, route.dst)
            msg = m.DataReady(request_id=rid, src=shell.name, dst=route.dst, seq=seq, eos=route.eos,
                              payload=None, sent_ns=time.monotonic_ns(), params=params)
            hosted.outlet.submit(msg, packed[key])
        if emit.eos:
            self._release(hosted, rid)

    def _send_acks(self) -> None:
        for producer, block_ids in self.releases.drain().items():
            local = self.stages.get(producer)
            if local is not None:
                local.outlet.on_ack(block_ids)
            else:
                self._send(producer, m.Ack(consumer=",".join(self.stages), block_ids=block_ids))

    def _expire_blocks(self) -> None:
        for name, hosted in self.stages.items():
            overdue = hosted.outlet.expire()
            if overdue:
                log.warning("stage %s: reclaimed %d shm blocks whose ack timed out", name, overdue)

    # -- request lifetime ---------------------------------------------------------------------
    def _fail(self, hosted: _HostedStage, rid: str, error: StageError) -> None:
        self._send(COORDINATOR, m.DataReady(request_id=rid, src=hosted.shell.name, dst=COORDINATOR, seq=0,
                                            eos=True, payload=None, sent_ns=time.monotonic_ns(), error=error))
        self._abort(rid)

    def _hand_off(self) -> None:
        for scheduler, item in self._handoffs:
            scheduler.inbox.put(item)
        self._handoffs.clear()

    def _abort(self, rid: str) -> None:
        self._tombstone(rid)
        self._handoffs = [(s, item) for s, item in self._handoffs if item.request_id != rid]
        for hosted in self.stages.values():
            hosted.counters["aborted"] += hosted.shell.knows(rid)
            hosted.outlet.drop_request(rid)
            hosted.scheduler.abort(rid)
            hosted.shell.forget(rid)

    def _release(self, hosted: _HostedStage, rid: str) -> None:
        hosted.counters["finished"] += 1
        hosted.shell.finish(rid)
        self._report(rid, hosted.shell.name, "released")

    def _report(self, rid: str, stage: str, event: str) -> None:
        self.progress.add(m.Progress(request_id=rid, stage=stage, event=event))

    def _tombstone(self, rid: str) -> None:
        self.tombstones.add(rid)

    def _stats(self, name: str, query_id: int) -> m.StageStats:
        hosted = self.stages[name]
        live = hosted.shell.request_ids() | hosted.scheduler.live_requests()
        resources = {
            "relay_blocks_out": hosted.outlet.writer.blocks_in_flight,  # device blocks included
            "relay_blocks_in": hosted.reader.blocks_held,
            "pending_sends": hosted.outlet.waiting,
            "buffered_inputs": hosted.shell.buffered_items(),
            "inbox_items": hosted.scheduler.inbox.qsize() + sum(s is hosted.scheduler for s, _ in self._handoffs),
            "progress_reports": self.progress.pending(name),
            **hosted.scheduler.resources(),
        }
        return m.StageStats(query_id=query_id, stage=name, pid=os.getpid(), live_requests=len(live),
                            resources=resources, counters=dict(hosted.counters), request_ids=sorted(live)[:50],
                            steps=hosted.scheduler.step_times.snapshot(),
                            device_memory=device_memory(hosted.shell.stage.device))

    def _close(self) -> None:
        with self.lock:
            self._closed = True
        for hosted in self.stages.values():  # without the lock: a scheduler may be waiting for it
            hosted.scheduler.stop()
            hosted.reader.close()
            hosted.outlet.close()
        for sock in [*self.inboxes, *self.pushes.values(), self.sub]:
            if sock is not None:
                sock.close(linger=0)
        self.progress.close()
        self.ctx.term()


def host_main(spec: HostSpec, builders: Mapping[str, Builder]) -> None:
    """Entry point of a spawned stage process."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the coordinator decides
    logging.basicConfig(level=os.environ.get("DUPLEX_LOG", "WARNING"),
                        format=f"%(asctime)s {spec.process}[%(process)d] %(levelname)s %(message)s")
    pipeline = PipelineConfig.model_validate(spec.pipeline)
    stages = pipeline.processes()[spec.process]
    yield_cpu(min(s.niceness for s in stages))  # fused stages: the most urgent one decides
    threads = max(s.threads for s in stages)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch/numpy when a builder imports them
    host = StageHost(spec, builders)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    signal.signal(signal.SIGTERM, lambda *_: setattr(host, "running", False))
    host.serve()
    if host.crash is not None:
        sys.exit(1)  # after ``serve`` closed the sockets and unlinked the segments


"""A media worker process: the WebRTC peers of some calls (ICE, DTLS, SRTP, Opus, RTP, the
inbound resample) on an event loop and GIL of their own. The server keeps the sessions; this
process forwards what each peer hears (``Heard``, events, states) and plays what the server
paces to it (``Play``). Spawned by ``media_pool.MediaWorkers``; it dies with the server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec
import numpy as np

from duplex.edge.config import EdgeConfig
from duplex.edge.memory import MemoryKeeper
from duplex.edge.webrtc import media_messages as mm
from duplex.edge.webrtc.media_pipe import FramedPipe
from duplex.edge.webrtc.rtc_options import use_loopback_candidates, use_vectorised_audio_level
from duplex.edge.webrtc.rtc_peer import RtcPeer
from duplex.lifecycle import die_with_parent

log = logging.getLogger("duplex.edge.media")
CODEC_THREADS = 4  # the encoder threads of a worker (aiortc's Opus encoding); its calls share them
QUEUED_FRAMES = 10  # frames the server sent ahead of the peer's sender (only after a stall here)


class FrameQueue:
    """The frames the server paced to one call, taken by its outbound track; when the track
    falls behind by more than ``QUEUED_FRAMES``, the oldest go (late speech is worse than lost)."""

    def __init__(self) -> None:
        self._frames: deque[np.ndarray] = deque(maxlen=QUEUED_FRAMES)
        self._arrived = asyncio.Event()

    def put(self, pcm: np.ndarray) -> None:
        self._frames.append(pcm)  # a full deque drops its oldest
        self._arrived.set()

    async def next(self) -> np.ndarray:
        while not self._frames:
            self._arrived.clear()
            await self._arrived.wait()
        return self._frames.popleft()


class LagProbe:
    """How late this loop runs: the worst lateness of a 50 ms timer since the last ``take``
    (the server's admission counts a worker's lag as its own)."""

    PERIOD_S = 0.05

    def __init__(self) -> None:
        self.worst_s = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.PERIOD_S
            await asyncio.sleep(self.PERIOD_S)
            self.worst_s = max(self.worst_s, loop.time() - due)

    def take(self) -> float:
        worst, self.worst_s = self.worst_s, 0.0
        return worst


class Forwarder:
    """A peer's listener here: everything it hears goes to the server."""

    def __init__(self, call: str, send: Callable[[mm.FromWorker], None]) -> None:
        self.call = call
        self.send = send

    def heard(self, pcm: np.ndarray, arrival: float, position: int | None) -> None:
        self.send(mm.Heard(self.call, pcm.tobytes(), arrival, position))

    def channel_opened(self) -> None:
        self.send(mm.ChannelOpened(self.call))

    def client_message(self, message: str | bytes) -> None:
        self.send(mm.ClientMessage.of(self.call, message))

    def state_changed(self, state: str) -> None:
        self.send(mm.StateChanged(self.call, state))

    def failed(self, reason: str) -> None:
        self.send(mm.Failed(self.call, reason))


class Worker:
    def __init__(self, spec: mm.WorkerSpec, config: EdgeConfig) -> None:
        self.spec = spec
        self.config = config
        self.pipe: FramedPipe | None = None
        self.peers: dict[str, RtcPeer] = {}
        self.frames: dict[str, FrameQueue] = {}
        self.tasks: set[asyncio.Task] = set()
        self.stopped = asyncio.Event()  # Stop, SIGTERM, or the server's end of the pipe closed
        self.closed_calls = 0
        self.lag = LagProbe()
        # ended calls' aiortc objects sit in reference cycles, as in the server process
        self.memory = MemoryKeeper(ended=lambda: self.closed_calls, live=lambda: len(self.peers))

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        _, pipe = await loop.create_unix_connection(
            lambda: FramedPipe(msgspec.msgpack.Decoder(mm.TO_WORKER), self.handle, self.stopped.set), self.spec.path)
        assert isinstance(pipe, FramedPipe)
        self.pipe = pipe
        self.memory.start()
        probe = loop.create_task(self.lag.run())
        pipe.send(mm.Ready(os.getpid()))
        try:
            await self.stopped.wait()
        finally:
            probe.cancel()

    def send(self, message: mm.FromWorker) -> None:
        if self.pipe is not None:
            self.pipe.send(message)

    def handle(self, message: mm.ToWorker) -> None:
        if isinstance(message, mm.Play):
            for call, pcm in message.frames:
                queue = self.frames.get(call)
                if queue is not None:
                    queue.put(np.frombuffer(pcm, dtype=np.int16))
        elif isinstance(message, mm.Send):
            peer = self.peers.get(message.call)
            if peer is not None:
                peer.send(message.text)
        elif isinstance(message, mm.Open):
            self.spawn(self.open(message))
        elif isinstance(message, mm.Flush):
            self.spawn(self.flush(message))
        elif isinstance(message, mm.Close):
            self.spawn(self.close(message.call))
        elif isinstance(message, mm.Ping):
            self.send(mm.Pong(message.sent_at, self.lag.take()))
        elif isinstance(message, mm.Stop):
            self.stopped.set()

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def open(self, message: mm.Open) -> None:
        queue = FrameQueue()
        peer = RtcPeer(self.config, Forwarder(message.call, self.send), queue.next)
        self.peers[message.call], self.frames[message.call] = peer, queue
        try:
            sdp = await peer.answer(message.offer)
        except Exception as exc:  # what aiortc raises for an offer it cannot answer
            self.send(mm.Refused(message.call, str(exc) or repr(exc)))
            await self.close(message.call)
            return
        self.send(mm.Answered(message.call, sdp, peer.low_latency))

    async def flush(self, message: mm.Flush) -> None:
        peer = self.peers.get(message.call)
        if peer is not None:
            await peer.flush(message.timeout_s)
        self.send(mm.Flushed(message.call))

    async def close(self, call: str) -> None:
        peer = self.peers.pop(call, None)
        self.frames.pop(call, None)
        if peer is not None:
            await peer.close()
            self.closed_calls += 1

    async def close_all(self) -> None:
        await self.memory.stop()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for call in list(self.peers):
            await self.close(call)
        if self.pipe is not None:
            self.pipe.close()


def full_pool(size: int) -> ThreadPoolExecutor:
    """A thread pool whose threads all exist from the start. aiortc encodes every outbound frame
    on the loop's default executor, which grows a thread whenever all are busy and never shrinks:
    fixed here, a worker's thread count says only how many calls it holds (and a soak's leak
    check can trust it)."""
    pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="media-codec")
    started = threading.Barrier(size + 1, timeout=30)
    for _ in range(size):
        pool.submit(started.wait)  # each waits on the barrier, so each submit starts a thread
    started.wait()
    return pool


async def _run(spec: mm.WorkerSpec) -> None:
    config = spec.edge_config()
    use_loopback_candidates(config.ice_loopback)
    use_vectorised_audio_level()
    asyncio.get_running_loop().set_default_executor(full_pool(CODEC_THREADS))
    worker = Worker(spec, config)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stopped.set)
    try:
        await worker.serve()
    finally:
        await worker.close_all()


def worker_main(spec: mm.WorkerSpec) -> None:
    """Entry point of a spawned media worker."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server decides
    logging.basicConfig(level=os.environ.get("DUPLEX_LOG", "WARNING"),
                        format=f"%(asctime)s media-{spec.index}[%(process)d] %(levelname)s %(message)s")
    asyncio.run(_run(spec))

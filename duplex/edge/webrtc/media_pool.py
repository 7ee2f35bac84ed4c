"""Media worker processes (``edge.media_workers``): the calls' WebRTC peers run in them, so
SRTP, Opus and RTP work no longer queues behind (or takes the GIL from) the server's one event
loop. The server keeps every session; it paces each call's output frames itself and sends them
to the call's worker. A worker that dies fails its calls (their slots are freed at once) and is
started again; while none is up, new calls get 503."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np

from duplex.cpu_wait import Silence
from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc import media_messages as mm
from duplex.edge.webrtc.media import WEBRTC_OUTPUT
from duplex.edge.webrtc.media_pipe import FramedPipe
from duplex.edge.webrtc.media_worker import worker_main
from duplex.edge.webrtc.rtc_peer import PeerListener
from duplex.lifecycle import end_process
from duplex.session.manager import SessionsFull
from duplex.session.observe import Refusal
from duplex.session.pacing import FramePacer

log = logging.getLogger("duplex.edge.media")
READY_TIMEOUT_S = 60.0  # a worker imports aiortc and PyAV before it says it is ready
ANSWER_TIMEOUT_S = 10.0
PING_FRAMES = 25  # a ping every half second (of 20 ms frame times)
RESTART_PAUSE_S = 1.0  # between a worker's death and its next start (no spin on a crash at start)


class MediaDown(SessionsFull):
    """No media worker can carry the call now: none is up, or the one given the offer died or
    stopped answering before it answered. The server's fault, not the offer's: 503, try again."""

    reason = Refusal.MEDIA_DOWN
    retry_after_s = RESTART_PAUSE_S


class RemotePeer:
    """A call's peer in a worker: the ``Peer`` the gateway holds."""

    def __init__(self, call: str, worker: WorkerHandle, listener: PeerListener,
                 pull: Callable[[float], np.ndarray]) -> None:
        self.call = call
        self.worker = worker
        self.listener = listener
        self._pull = pull
        self.low_latency = False
        self._state = "new"
        self._channel_open = False
        self._replies: dict[type, asyncio.Future] = {}
        self.playing = False  # its worker's pacer sends it frames (from when its media connects)

    @property
    def state(self) -> str:
        return self._state

    @property
    def channel_open(self) -> bool:
        return self._channel_open

    async def answer(self, offer_sdp: str) -> str:
        reply = await self._ask(mm.Open(self.call, offer_sdp), mm.Answered, ANSWER_TIMEOUT_S)
        if isinstance(reply, mm.Refused):
            raise ValueError(reply.reason)
        assert isinstance(reply, mm.Answered)
        self.low_latency = reply.low_latency
        return reply.sdp

    def send(self, text: str) -> None:
        if self._channel_open:
            self.worker.send(mm.Send(self.call, text))

    async def flush(self, timeout_s: float) -> None:
        if self._channel_open:
            await self._ask(mm.Flush(self.call, timeout_s), mm.Flushed, timeout_s + 0.5)

    async def close(self) -> None:
        self._channel_open = False
        self.playing = False
        self.worker.forget(self)

    async def _ask(self, message: mm.ToWorker, reply: type, timeout_s: float) -> mm.FromWorker | None:
        """Send and wait for the worker's reply (None if the wait ran out)."""
        future = asyncio.get_running_loop().create_future()
        self._replies[reply] = future
        self.worker.send(message)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            if reply is mm.Answered:
                raise MediaDown(f"the media worker given this call did not answer within {timeout_s:g} s; "
                                "try again shortly") from None
            return None
        finally:
            self._replies.pop(reply, None)

    def deliver(self, message: mm.FromWorker) -> None:
        """A message of the worker about this call."""
        if isinstance(message, mm.Heard):
            self.listener.heard(np.frombuffer(message.pcm, dtype=np.int16).copy(), message.arrival, message.position)
        elif isinstance(message, mm.StateChanged):
            self._state = message.state
            self.playing = self.playing or message.state == "connected"
            self.listener.state_changed(message.state)
        elif isinstance(message, mm.ChannelOpened):
            self._channel_open = True
            self.listener.channel_opened()
        elif isinstance(message, mm.ClientMessage):
            self.listener.client_message(message.message())
        elif isinstance(message, mm.Failed):
            self.listener.failed(message.reason)
        else:  # a reply: Answered or Refused (to Open), Flushed
            key = mm.Answered if isinstance(message, mm.Refused) else type(message)
            future = self._replies.get(key)
            if future is not None and not future.done():
                future.set_result(message)

    def next_frame(self, due: float) -> bytes | None:
        """The session's frame due now (None: the session failed; the call is told and ends)."""
        try:
            return self._pull(due).tobytes()
        except Exception as exc:
            log.exception("the session failed on its output")
            self.playing = False
            self.listener.failed(repr(exc))
            return None

    def worker_died(self, reason: str) -> None:
        self._channel_open = False
        self.playing = False
        self._state = "failed"
        answering = self._replies.pop(mm.Answered, None)
        if answering is not None and not answering.done():  # the offer is refused (503): no call to fail
            answering.set_exception(MediaDown(f"{reason}; try again shortly"))
            return
        for future in self._replies.values():
            if not future.done():
                future.set_exception(RuntimeError(reason))
        self.listener.failed(reason)


class WorkerHandle:
    """One worker process and its pipe (``media_pipe``); made again (a new socket) at each restart."""

    def __init__(self, index: int, run_dir: str, generation: int, edge: EdgeConfig) -> None:
        self.spec = mm.WorkerSpec(index=index, path=os.path.join(run_dir, f"media-{index}-{generation}.sock"),
                                  edge=edge.model_dump(mode="json"))
        self.calls: dict[str, RemotePeer] = {}
        self.process: mp.process.BaseProcess | None = None
        self.pid: int | None = None
        self.alive = False
        self.pipe: FramedPipe | None = None
        self.ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._server: asyncio.Server | None = None
        self.lags: deque[tuple[float, float]] = deque()  # (when, how late its loop ran) per Pong
        self.silence = Silence(PING_FRAMES * WEBRTC_OUTPUT.frame_ms / 1000)  # since its last Pong
        self.stalled_s: float | None = None  # set when the watchdog ended it
        self.slow_s = 0.0  # time it spent busy or waiting for a CPU while its answer was late, summed

    async def listen(self) -> None:
        self._server = await asyncio.get_running_loop().create_unix_server(self._connected, self.spec.path)

    def _connected(self) -> FramedPipe:
        pipe = FramedPipe(msgspec.msgpack.Decoder(mm.FROM_WORKER), self._on_message, self._on_lost)
        self.pipe = self.pipe or pipe
        return pipe

    def _on_message(self, message: mm.FromWorker) -> None:
        if isinstance(message, mm.Ready):
            if not self.ready.done() and self._server is not None:
                self.ready.set_result(message.pid)
                self._server.close()  # its one worker is in: nobody else may connect
            return
        if isinstance(message, mm.Pong):
            self.silence.heard()
            self.lags.append((time.monotonic(), message.loop_lag_s))
            return
        peer = self.calls.get(getattr(message, "call", ""))
        if peer is not None:
            peer.deliver(message)

    def _on_lost(self) -> None:
        self.alive = False  # the process's end (its sentinel) fails the calls and restarts it

    def send(self, message: mm.ToWorker) -> None:
        if self.alive and self.pipe is not None:
            self.pipe.send(message)

    def loop_lag_s(self, window_s: float) -> float:
        """The worst lateness its loop reported within the last ``window_s``."""
        horizon = time.monotonic() - window_s
        while self.lags and self.lags[0][0] < horizon:
            self.lags.popleft()
        return max((lag for _, lag in self.lags), default=0.0)

    @property
    def dropped(self) -> int:
        return self.pipe.dropped if self.pipe is not None else 0

    async def pace(self, stall_s: float) -> None:
        """Every playing call's output, one frame per 20 ms deadline here, in one message to
        the worker (pacing here keeps the echo gate's idea of what was played in step with the
        session; one message per frame time, not per call, keeps the pipe's wake-ups few). Every
        ``PING_FRAMES`` it pings the worker and watches the answers (``watch``)."""
        pacer = FramePacer(WEBRTC_OUTPUT.frame_ms / 1000)
        late_checks = 0

        async def tick(due: float) -> bool:
            nonlocal late_checks
            frames = [(peer.call, pcm) for peer in list(self.calls.values())
                      if peer.playing and (pcm := peer.next_frame(due)) is not None]
            if frames:
                self.send(mm.Play(frames))
            if pacer.frames % PING_FRAMES == 0:
                self.send(mm.Ping(due))
                late_checks = late_checks + 1 if self.watch(due, stall_s) else 0
                if late_checks >= 2:  # twice in a row: this loop has read whatever had arrived
                    self._end_stalled()
                    return True
            return False

        await pacer.run(tick)

    def watch(self, now: float, stall_s: float) -> bool:
        """One watchdog tick: True once the worker's silence is past the limit (``cpu_wait``: time
        it spent busy or waiting for a CPU, on a busy box, counts only up to ten limits)."""
        self.slow_s += self.silence.tick(self.pid, now)
        return self.silence.over(stall_s)

    def _end_stalled(self) -> None:
        """The worker stopped answering (stopped, stuck in a call into C, swapping): it is ended,
        which fails its calls and starts it again, like any other death."""
        log.error("media worker %d (pid %s) has not answered for %s; ending it", self.spec.index, self.pid,
                  self.silence.describe())
        self.stalled_s = self.silence.total_s
        if self.process is not None and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    def forget(self, peer: RemotePeer) -> None:
        if self.calls.pop(peer.call, None) is not None:
            self.send(mm.Close(peer.call))

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
        if self._server is not None:
            self._server.close()


class MediaWorkers:
    """``count`` worker processes; ``make_peer`` is the gateway's ``PeerMaker``."""

    def __init__(self, edge: EdgeConfig, count: int, lag_window_s: float = 2.0) -> None:
        self.edge = edge
        self.count = count
        self.lag_window_s = lag_window_s  # admission by load reads the workers' worst lag within it
        self.run_dir = ""  # made by start, removed by stop
        self._mp = mp.get_context("spawn")
        self.workers: list[WorkerHandle | None] = [None] * count
        self._pacers: dict[int, asyncio.Task] = {}
        self._restarting: set[asyncio.Task] = set()
        self.restarts = 0
        self._stopping = False

    async def start(self) -> None:
        self.run_dir = tempfile.mkdtemp(prefix="duplex-media-")
        await asyncio.gather(*(self._start(index, 0) for index in range(self.count)))

    async def _start(self, index: int, generation: int) -> None:
        handle = WorkerHandle(index, self.run_dir, generation, self.edge)
        self.workers[index] = handle
        await handle.listen()
        process = self._mp.Process(target=worker_main, args=(handle.spec,), name=f"duplex-media-{index}", daemon=True)
        process.start()
        handle.process = process
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while not handle.ready.done():  # it imports aiortc and PyAV, then connects and says so
            if not process.is_alive():
                handle.close()
                raise RuntimeError(f"media worker {index} exited (code {process.exitcode}) before it was ready")
            if loop.time() > deadline:
                process.kill()
                handle.close()
                raise RuntimeError(f"media worker {index} was not ready within {READY_TIMEOUT_S:g} s")
            await asyncio.wait({handle.ready}, timeout=0.2)
        handle.pid, handle.alive = handle.ready.result(), True
        pacer = loop.create_task(handle.pace(self.edge.media_stall_s), name=f"media-pace-{index}")
        self._pacers[index] = pacer
        loop.add_reader(process.sentinel, self._on_exit, handle, generation, pacer)

    def _on_exit(self, handle: WorkerHandle, generation: int, pacer: asyncio.Task) -> None:
        """The worker's process ended (its sentinel became readable)."""
        assert handle.process is not None
        asyncio.get_running_loop().remove_reader(handle.process.sentinel)
        pacer.cancel()
        task = asyncio.get_running_loop().create_task(self._died(handle, generation))
        self._restarting.add(task)
        task.add_done_callback(self._restarting.discard)

    async def _died(self, handle: WorkerHandle, generation: int) -> None:
        """Its calls fail (the caller's media went with it), and it starts again."""
        handle.alive = False
        assert handle.process is not None
        handle.process.join(0)
        reason = (f"its media worker (pid {handle.pid}) stopped answering for {handle.stalled_s:.1f} s and was ended"
                  if handle.stalled_s is not None else
                  f"its media worker (pid {handle.pid}) ended with exit code {handle.process.exitcode}")
        if not self._stopping:  # (at the server's stop its end is no news)
            log.error("media worker %d %s", handle.spec.index, reason.removeprefix("its media worker "))
        for peer in list(handle.calls.values()):
            peer.worker_died(f"the call's media failed: {reason}")
        handle.calls.clear()
        handle.close()
        if self._stopping:
            return
        self.restarts += 1
        await asyncio.sleep(RESTART_PAUSE_S)
        if self._stopping:
            return
        try:
            await self._start(handle.spec.index, generation + 1)
        except Exception:
            log.exception("media worker %d could not start again; its calls go to the others", handle.spec.index)

    def make_peer(self, call_id: str, listener: PeerListener, pull: Callable[[float], np.ndarray]) -> RemotePeer:
        live = [w for w in self.workers if w is not None and w.alive]
        if not live:
            raise MediaDown("no media worker is up (one is starting again); try again shortly")
        worker = min(live, key=lambda w: len(w.calls))
        peer = RemotePeer(call_id, worker, listener, pull)
        worker.calls[call_id] = peer
        return peer

    async def stop(self) -> None:
        self._stopping = True
        for handle in self.workers:
            if handle is not None:
                handle.send(mm.Stop())
        for handle in self.workers:
            if handle is not None and handle.process is not None:
                await asyncio.to_thread(end_process, handle.process, 5.0)
        tasks = [*self._pacers.values(), *self._restarting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for handle in self.workers:
            if handle is not None:
                handle.close()
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def loop_lag_s(self) -> float:
        """The worst lateness of the live workers' loops (admission by load counts it)."""
        return max((w.loop_lag_s(self.lag_window_s) for w in self.workers if w is not None and w.alive),
                   default=0.0)

    def stats(self) -> dict:
        workers = [w for w in self.workers if w is not None]
        return {"workers": self.count, "up": sum(w.alive for w in workers), "restarts": self.restarts,
                "loop_lag_ms": [round(w.loop_lag_s(self.lag_window_s) * 1000, 1) for w in workers if w.alive],
                "pids": [w.pid for w in workers if w.alive],
                "calls": [len(w.calls) for w in workers], "dropped_commands": sum(w.dropped for w in workers),
                # what a busy box cost them: seconds spent busy or waiting for a CPU while late answering
                "late_slow_s": [round(w.slow_s, 1) for w in workers if w.alive]}


"""A Twilio-Media-Streams-compatible WebSocket endpoint: phone calls that a telephony provider
bridges to us as JSON messages carrying base64 mu-law.

The provider already orders and buffers the media (it rides a TCP connection), so caller audio
goes straight to the agent. Agent audio is sent as it is produced, paced at 20 ms per frame, so
the provider's queue stays short and a ``clear`` on barge-in silences the caller at once. A
``mark`` follows each stretch of agent speech; the provider echoes it when that audio has played.

A stream holds its session only while media flows (issue 15): no ``start`` within
``start_timeout_s`` of connecting, no ``media`` for ``media_timeout_s``, or ``max_call_s`` after
its ``start``, and it is closed; ``start``s are rate-limited per source address and in total.
"""

from __future__ import annotations

import asyncio
import binascii
import collections
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from xml.sax.saxutils import quoteattr

import msgspec
from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response

from duplex.audio import Resampler
from duplex.edge.media import g711
from duplex.edge.media.audio import PHONE_FRAME, PHONE_RATE, PhoneDecoder
from duplex.edge.phone.bridge import AgentFactory, AgentUnavailable, CallAgent, CallInfo
from duplex.edge.phone.refusals import Refusals
from duplex.edge.rate import UNCOUNTED, CallRate, Pending, PendingCalls, RateLimited, exempt
from duplex.edge.twilio import messages as tm
from duplex.edge.twilio.config import TwilioLimits
from duplex.edge.twilio.control import TwilioCallControl
from duplex.session.pacing import FramePacer

log = logging.getLogger(__name__)
MAX_MESSAGE_CHARS = 65536  # one media message is ~20 ms (~250 chars); anything this big is abuse
MAX_PAYLOAD_BYTES = PHONE_RATE  # one second of mu-law in a single media message at most
END_FLUSH_S = 1.0  # the agent ended the call: its last audio gets this long to play (mark echoed)
STREAM_PATH = "/twilio/media-stream"


class StreamError(Exception):
    """The stream ends: the provider sent something we cannot play, or no session, rate or
    time is left for it. ``code`` is the WebSocket close code, ``kind`` the counter."""

    def __init__(self, message: str, code: int = 1003, kind: str = "streams_refused") -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


class TwilioMediaStream:
    """One WebSocket connection = one phone call."""

    def __init__(self, agent_factory: AgentFactory, send_text: Callable[[str], Awaitable[None]],
                 counters: collections.Counter[str] | None = None,
                 limits: TwilioLimits | None = None,
                 admit: Callable[[], None] | None = None, unstarted: Pending = UNCOUNTED) -> None:
        self._factory = agent_factory
        self._unstarted = unstarted  # counts against the source until its ``start``
        self._limits = limits or TwilioLimits()
        self._admit = admit  # raises StreamError when the door takes no new call now
        self._opened = self._started = self._last_media = 0.0
        self._send_text = send_text
        self.counters = counters if counters is not None else collections.Counter()
        self.stream_sid = ""
        self.agent: CallAgent | None = None
        self.played_marks: list[str] = []
        self._decoder: PhoneDecoder | None = None
        self._encoder: Resampler | None = None
        self._pacer_task: asyncio.Task | None = None
        self._run_task: asyncio.Task | None = None
        self._failure: BaseException | None = None  # the agent's audio failed: the call must end
        self._ending: asyncio.Task | None = None  # the agent ended the call (``end``)
        self._marks_moved = asyncio.Event()  # a mark sent or echoed
        self._speaking = False
        self._pending = b""  # encoded agent audio short of a whole frame
        self._marks_sent = 0
        self._sends: set[asyncio.Task] = set()

    async def run(self, messages: AsyncIterator[str]) -> None:
        """Handle the provider's messages until ``stop``, the connection ends or a deadline
        passes (StreamError)."""
        self._opened = self._last_media = asyncio.get_running_loop().time()
        self._run_task = asyncio.current_task()
        try:
            async with asyncio.timeout(self._deadline()) as deadline:
                async for text in messages:
                    if await self._receive(text):
                        return
                    deadline.reschedule(self._deadline())
        except TimeoutError:
            raise self._expired() from None
        except asyncio.CancelledError:
            if (self._failure is None and self._ending is None) or self._run_task is None:
                raise
            self._run_task.uncancel()  # our own cancel (``_pacer_ended``, ``end``), not the server's
            if self._failure is None:
                return  # the agent ended the call: closed as a stop is
            raise StreamError(f"server error: the agent's audio failed ({self._failure!r})"[:200], 1011,
                              "failed") from None

    def _pacer_ended(self, task: asyncio.Task) -> None:
        """The agent's audio stopped on an error: the caller would hear nothing from now on while
        the stream went on, so the call ends (1011) instead."""
        if task.cancelled() or task.exception() is None:
            return
        self._failure = task.exception()
        log.error("twilio stream %s: the agent's audio failed", self.stream_sid or "-", exc_info=self._failure)
        if self._run_task is not None:
            self._run_task.cancel()

    async def _receive(self, text: str) -> bool:
        """One message; True at ``stop``."""
        if len(text) > MAX_MESSAGE_CHARS:
            self._drop("oversize", f"{len(text)} characters")
            return False
        try:
            message = tm.decode_inbound(text)
        except msgspec.MsgspecError as exc:
            self._drop("bad_messages", str(exc)[:200])
            return False
        if isinstance(message, tm.Stop):
            return True
        await self._handle(message)
        return False

    def _deadline(self) -> float:
        limits = self._limits
        if self.agent is None:
            return self._opened + limits.start_timeout_s
        return min(self._last_media + limits.media_timeout_s, self._started + limits.max_call_s)

    def _expired(self) -> StreamError:
        limits = self._limits
        if self.agent is None:
            return StreamError(f"no start within {limits.start_timeout_s:g} s", 1000,
                               "timeouts_no_start")
        if asyncio.get_running_loop().time() >= self._started + limits.max_call_s:
            return StreamError(f"maximum call duration ({limits.max_call_s:g} s)", 1000,
                               "max_duration")
        return StreamError(f"no media for {limits.media_timeout_s:g} s", 1000, "timeouts_no_media")

    async def _handle(self, message: tm.Inbound) -> None:
        if isinstance(message, tm.Start):
            await self._start(message)
        elif isinstance(message, tm.Media):
            self._caller_media(message)
        elif isinstance(message, tm.Mark):
            self.played_marks.append(message.mark.name)
            self._marks_moved.set()
        elif isinstance(message, tm.Dtmf) and self.agent is not None:
            self.agent.dtmf(message.dtmf.digit)

    async def _start(self, message: tm.Start) -> None:
        if self.agent is not None:
            self._drop("bad_messages", "a second start on one stream")
            return
        media_format = message.start.mediaFormat
        if (media_format.encoding != tm.MULAW_ENCODING or media_format.sampleRate != PHONE_RATE
                or media_format.channels != 1):
            raise StreamError(f"unsupported media format {msgspec.json.encode(media_format)!r}")
        if self._admit is not None:
            self._admit()
        self.stream_sid = message.start.streamSid or message.streamSid
        params = message.start.customParameters
        info = CallInfo(message.start.callSid or self.stream_sid, "twilio",
                        params.get("from", ""), params.get("to", ""), dict(params), TwilioCallControl(self.end))
        try:
            self.agent = await self._factory(info)
        except AgentUnavailable as exc:
            raise StreamError(f"no session available: {exc}") from exc
        self.agent.set_barge_in_listener(self._on_barge_in)
        self._decoder = PhoneDecoder("PCMU", self.agent.input_rate)
        self._encoder = Resampler(PHONE_RATE)
        loop = asyncio.get_running_loop()
        self._started = self._last_media = loop.time()
        self._pacer_task = loop.create_task(self._send_agent_audio())
        self._pacer_task.add_done_callback(self._pacer_ended)
        self._unstarted.release()
        self.counters["streams_started"] += 1

    def _caller_media(self, message: tm.Media) -> None:
        if self.agent is None or self._decoder is None:
            self._drop("bad_messages", "media before start")
            return
        if message.media.track not in (tm.INBOUND_TRACK, "inbound_track"):
            return  # an outbound-track copy of our own audio: not the caller
        try:
            payload = tm.b64decode(message.media.payload)
        except (binascii.Error, ValueError) as exc:
            self._drop("bad_media", f"payload is not base64: {exc}")
            return
        if not payload or len(payload) > MAX_PAYLOAD_BYTES:
            self._drop("bad_media", f"payload of {len(payload)} bytes")
            return
        self._last_media = asyncio.get_running_loop().time()
        self.agent.caller_audio(self._decoder(payload), time.monotonic())

    async def _send_agent_audio(self) -> None:
        await FramePacer(PHONE_FRAME / PHONE_RATE).run(self._send_frame)

    async def _send_frame(self, due: float) -> None:
        assert self.agent is not None and self._encoder is not None
        frame = self.agent.agent_audio(due)
        if frame.any():
            self._pending += g711.encode(self._encoder(frame, self.agent.output_rate), "PCMU")
            self._speaking = True
        elif self._speaking:
            self._speaking = False
            await self._send(tm.OutMark(streamSid=self.stream_sid, mark=tm.MarkInfo(self._next_mark())))
        while len(self._pending) >= PHONE_FRAME:
            chunk, self._pending = self._pending[:PHONE_FRAME], self._pending[PHONE_FRAME:]
            await self._send(tm.OutMedia(streamSid=self.stream_sid,
                                         media=tm.OutboundPayload(tm.b64encode(chunk))))
            self.counters["media_sent"] += 1

    def _on_barge_in(self) -> None:
        self.counters["clears_sent"] += 1
        self._speaking = False
        clear = tm.Clear(streamSid=self.stream_sid)
        task = asyncio.get_running_loop().create_task(self._send(clear))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, message: msgspec.Struct) -> None:
        try:
            await self._send_text(tm.encode(message))
        except (RuntimeError, ConnectionError, WebSocketDisconnect):
            self.counters["send_failures"] += 1  # the socket went away; run() ends shortly

    def end(self, reason: str) -> None:
        """The agent ends the call: once its last audio has played (its mark echoed, or
        ``END_FLUSH_S``), the stream is closed as if the provider had stopped it."""
        if self._ending is None and self._run_task is not None and not self._run_task.done():
            log.info("twilio stream %s: ended by the agent (%s)", self.stream_sid or "-", reason)
            self.counters["ended_by_agent"] += 1
            self._ending = asyncio.get_running_loop().create_task(self._end_when_played())

    async def _end_when_played(self) -> None:
        try:
            async with asyncio.timeout(END_FLUSH_S):
                while self._speaking or len(self.played_marks) < self._marks_sent:
                    self._marks_moved.clear()
                    await self._marks_moved.wait()
        except TimeoutError:
            pass
        if self._run_task is not None:
            self._run_task.cancel()

    def _next_mark(self) -> str:
        self._marks_moved.set()
        self._marks_sent += 1
        return f"agent-speech-{self._marks_sent}"

    def _drop(self, kind: str, detail: str) -> None:
        self.counters[kind] += 1
        if self.counters[kind] <= 20 or self.counters[kind] % 100 == 0:
            log.warning("twilio stream %s: %s: %s", self.stream_sid or "-", kind, detail)

    async def close(self) -> None:
        if self._ending is not None and self._ending is not asyncio.current_task():
            self._ending.cancel()
            await asyncio.gather(self._ending, return_exceptions=True)
        if self._pacer_task is not None:
            self._pacer_task.cancel()
            await asyncio.gather(self._pacer_task, *self._sends, return_exceptions=True)
        agent, self.agent = self.agent, None
        if agent is not None:
            await agent.close()


class TwilioEndpoint:
    """The WebSocket route (and the TwiML that points a provider's call at it)."""

    def __init__(self, agent_factory: AgentFactory, limits: TwilioLimits | None = None,
                 max_sessions: int | None = None) -> None:
        self.agent_factory = agent_factory
        self.limits = limits or TwilioLimits()
        self.live: set[TwilioMediaStream] = set()
        self.counters: collections.Counter[str] = collections.Counter()
        self.rate = CallRate(self.limits.rate, "twilio", max_sessions=max_sessions)
        # streams connected without their ``start`` yet, per source (the door's half-open calls)
        self.unstarted = PendingCalls(self.limits.rate.pending_cap(max_sessions or 8), "Twilio",
                                      self.limits.start_timeout_s)
        self.refusals = Refusals(self.counters, log, "twilio")

    def stats(self) -> dict:
        return {"streams": len(self.live), **self.counters, "unstarted": self.unstarted.stats()}

    def _admit(self, source: str) -> None:
        if exempt(source, self.limits.limit_loopback):
            return
        try:
            self.rate.check(source)
        except RateLimited as exc:  # 1013: try again later
            raise StreamError(f"{exc} (retry after {exc.retry_after} s)", 1013,
                              "rate_limited") from exc

    def router(self, path: str = STREAM_PATH) -> APIRouter:
        router = APIRouter()
        router.add_api_websocket_route(path, self.serve)
        router.add_api_route("/twilio/voice", self.twiml, methods=["GET", "POST"])
        return router

    async def serve(self, websocket: WebSocket) -> None:
        source = websocket.client.host if websocket.client else ""
        try:
            unstarted = (UNCOUNTED if exempt(source, self.limits.limit_loopback)
                         else self.unstarted.admit(source))
        except RateLimited as exc:  # before the handshake: no stream, no task, one reply
            self.refusals.note("pending_capped", str(exc))
            await _deny(websocket, exc)
            return
        stream = TwilioMediaStream(self.agent_factory, websocket.send_text, self.counters,
                                   self.limits, lambda: self._admit(source), unstarted)
        self.live.add(stream)
        try:
            await websocket.accept()
            await stream.run(_texts(websocket, self.counters))
            await _close(websocket, 1000, "stream stopped")
        except StreamError as exc:
            self.refusals.note(exc.kind, str(exc))  # counted by kind, logged at a bounded rate
            await _close(websocket, exc.code, str(exc)[:120])
        except WebSocketDisconnect:
            pass
        finally:
            unstarted.release()
            await stream.close()
            self.live.discard(stream)

    async def twiml(self, request: Request) -> Response:
        """TwiML for the provider's incoming-call webhook: connect the call to our stream."""
        scheme = "wss" if request.url.scheme == "https" else "ws"
        url = f"{scheme}://{request.url.netloc}{STREAM_PATH}"
        body = ('<?xml version="1.0" encoding="UTF-8"?>'
                f"<Response><Connect><Stream url={quoteattr(url)}/></Connect></Response>")
        return Response(body, media_type="application/xml")


async def _deny(websocket: WebSocket, limited: RateLimited) -> None:
    """Refuse the handshake: 429 with Retry-After where the server can send a response, else a
    close (1013: try again later)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(
            {"error": {"type": "rate_limit_error", "message": str(limited)}}, status_code=429,
            headers={"Retry-After": str(limited.retry_after)}))
    else:
        await websocket.close(1013, str(limited)[:120])


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code=code, reason=reason)
    except RuntimeError:
        pass  # the provider closed first


async def _texts(websocket: WebSocket, counters: collections.Counter[str]) -> AsyncIterator[str]:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            counters["binary_frames"] += 1  # the protocol is JSON text only
            continue
        yield text

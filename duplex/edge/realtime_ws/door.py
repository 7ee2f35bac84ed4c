"""The Realtime WebSocket door: ``GET /v1/realtime?model=...`` (what the official ``openai``
SDK's ``realtime.connect`` opens), one session per connection, over the same session manager,
sessions and barge-in as WebRTC and the phones.

The door is thin. Client events go to the shared protocol (``session/protocol.py``); it handles
here only what is the transport's: the audio formats (``audio.py``) and the limits (frame
size, append rate, session length: each answered with an ``error`` event, then a clean close).
Every event the session emits is forwarded as it is, so events this file has never heard of
(tool calls, ours prefixed ``duplex.``) reach the client too.

Agent audio is paced as on every door: one 20 ms frame per deadline, sent as
``response.output_audio.delta`` when it holds agent audio; so the session knows what was played,
and a barge-in cuts where the caller's ears are. A response's ``response.done`` is held until its
audio has been sent (``response.output_audio.done`` goes first), as a client reading the stream
expects.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import msgspec
from fastapi import WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from duplex.edge.config import RealtimeLimits
from duplex.edge.rate import UNCOUNTED, Pending, RateLimited
from duplex.edge.realtime_ws.audio import WS_OUTPUT, Format, InputDecoder, OutputEncoder, formats_of
from duplex.session.call_control import EndOnlyCallControl
from duplex.session.door import AudioClear, SimpleDoor
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.pacing import FramePacer
from duplex.session.playout import PulledFrame
from duplex.session.protocol import announce_session, apply_settings, handle_client_message
from duplex.session.realtime import events as ev
from duplex.session.realtime import item_events as iev
from duplex.session.recording import Opening
from duplex.session.session import VoiceSession

log = logging.getLogger("duplex.edge")
REALTIME_PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"  # browsers name it (with the key in a second subprotocol, see auth.py)
MAX_QUEUED = 1500  # events waiting for a client that does not read (30 s of audio deltas): it is dropped


class _Probe(msgspec.Struct):
    type: str = ""


_probe = msgspec.json.Decoder(_Probe)
_CLOSE = object()  # in the send queue: close the socket after what came before


class RealtimeConnection:
    """One WebSocket = one session."""

    def __init__(self, ws: WebSocket, sessions: SessionManager, limits: RealtimeLimits,
                 settings: ev.SessionSettings | None = None, pending: Pending = UNCOUNTED,
                 owner: str | None = None) -> None:
        self.ws = ws
        self.owner = owner  # who opened it (auth.owner_of), kept with its recording
        self.sessions = sessions
        self.limits = limits
        self._pending = pending
        self.settings = settings  # from the client secret that opened it, if any
        self.session: VoiceSession | None = None
        self.input = Format()
        self.output = Format()
        self._encoder = OutputEncoder(self.output)
        self._queue: asyncio.Queue[str | object] = asyncio.Queue()
        self._held: list[ev.ServerEvent] = []  # response.done etc. waiting for the audio to be sent
        self._audio: tuple[str, str] | None = None  # (response id, item id) whose audio is being sent
        self._budget = AppendBudget(limits.append_burst_s, limits.append_rate)
        self._closing = False
        self._own_events = 0
        self.close_code: int | None = None
        self.limit_hit = False

    # -- lifetime -------------------------------------------------------------------------------
    async def run(self) -> None:
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in self.ws.scope.get("subprotocols", []) else None
        config = apply_settings(self.sessions.config, self.settings) if self.settings else None
        await self.ws.accept(subprotocol=subprotocol)
        try:
            opening = Opening(self.owner, self.settings.recording if self.settings else None)
            door = SimpleDoor("websocket", WS_OUTPUT, self._send, self._clear,
                              EndOnlyCallControl(self._end_call, "a Realtime WebSocket session"))
            self.session = self.sessions.open(door, config, opening=opening)
        except SessionsFull as exc:
            await self._refuse("server_busy", str(exc), 1013)
            return
        session = self.session
        session.items.decoder = InputDecoder(self.input)
        announce_session(session, self.sessions.model)
        tasks = [asyncio.create_task(self._write(), name="ws-write"),
                 asyncio.create_task(self._play(session), name="ws-play"),
                 asyncio.create_task(self._expire(), name="ws-expire")]
        reader = asyncio.create_task(self._read(session), name="ws-read")
        try:
            await asyncio.wait([reader, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [reader, *tasks]:
                task.cancel()
            await asyncio.gather(reader, *tasks, return_exceptions=True)
            await self.sessions.close(session)

    async def _refuse(self, code: str, message: str, close_code: int) -> None:
        error = ev.ErrorEvent(error=ev.ErrorDetail(type="server_error", code=code, message=message),
                              event_id="event_refused")
        await self.ws.send_text(ev.encode_event(error))
        await self.ws.close(close_code, message[:120])

    async def _read(self, session: VoiceSession) -> None:
        while not self._closing:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                break
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            self._on_message(session, raw)
        self._queue.put_nowait(_CLOSE)

    def _on_message(self, session: VoiceSession, raw: str | bytes) -> None:
        self._pending.release()  # a client that speaks is connected
        if len(raw) > self.limits.max_frame_bytes:
            self._fail("event_too_large", f"a message of {len(raw)} bytes; the limit is "
                                          f"{self.limits.max_frame_bytes}", 1009)
            return
        try:
            kind = _probe.decode(raw).type
        except msgspec.MsgspecError:
            kind = ""  # the protocol names what is wrong with it
        if kind == "input_audio_buffer.append" and not self._within_rate(raw):
            return
        if kind == "session.update" and not self._update_formats(session, raw):
            return
        handle_client_message(session, raw, self.sessions.model, max_bytes=self.limits.max_frame_bytes)

    def _within_rate(self, raw: str | bytes) -> bool:
        seconds = len(raw) * 3 / 4 / self.input.bytes_per_second  # base64 -> bytes -> audio seconds
        if self._budget.take(seconds, time.monotonic()):
            return True
        self._fail("rate_limit_exceeded", f"audio is appended faster than {self.limits.append_rate:g}x real time "
                                          f"(beyond a {self.limits.append_burst_s:g} s burst)", 1008)
        return False

    def _update_formats(self, session: VoiceSession, raw: str | bytes) -> bool:
        """Apply the audio formats of a session.update (the rest is the protocol's)."""
        try:
            event = ev.decode_client_event(raw)
            if not isinstance(event, ev.SessionUpdate):
                return True
            fmt_in, fmt_out = formats_of(event.session)
        except ev.ClientEventError:
            return True  # the protocol reports it
        except ValueError as exc:
            session.emit_error("invalid_session_settings", str(exc), event.event_id)
            return False
        if fmt_in is not None and fmt_in != self.input:
            self.input = fmt_in
            session.items.decoder = InputDecoder(fmt_in)
        if fmt_out is not None and fmt_out != self.output:
            self.output = fmt_out
            self._encoder = OutputEncoder(fmt_out)
        return True

    async def _expire(self) -> None:
        await asyncio.sleep(self.limits.max_session_s)
        self._fail("session_expired", f"calls last at most {self.limits.max_session_s:g} s (max_call_s); "
                                      "this one has ended", 1000)

    def _fail(self, code: str, message: str, close_code: int) -> None:
        """A limit was hit: tell the client why, then close (after what is queued)."""
        if self._closing:
            return
        if self.session is not None:
            self.session.emit_error(code, message)
        self._closing, self.close_code, self.limit_hit = True, close_code, True
        self._queue.put_nowait(_CLOSE)

    def _end_call(self, reason: str) -> None:
        """The conversation ends the call: the socket closes (1000) after what is queued."""
        if not self._closing:
            self._closing, self.close_code = True, 1000
            self._queue.put_nowait(_CLOSE)

    async def _write(self) -> None:
        while True:
            item = await self._queue.get()
            if item is _CLOSE:
                try:
                    await self.ws.close(self.close_code or 1000)
                except RuntimeError:
                    pass  # already closed by the client
                return
            try:
                await self.ws.send_text(item)  # type: ignore[arg-type]
            except (WebSocketDisconnect, RuntimeError, OSError):
                return

    # -- events out -----------------------------------------------------------------------------
    def _send(self, event: ev.ServerEvent) -> None:
        """Everything the session says (the session's ``send``): forwarded, with this door's
        audio formats in the session resource and response.done after its audio."""
        if self._queue.qsize() > MAX_QUEUED:
            self._fail("client_too_slow", f"over {MAX_QUEUED} events wait for the client to read them", 1008)
            return
        if isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            self._describe_formats(event.session)
        elif isinstance(event, ev.ResponseDone | ev.AudioTranscriptDone) and self._audio_pending(event):
            self._held.append(event)
            return
        self._queue.put_nowait(ev.encode_event(event))

    def _clear(self, why: AudioClear) -> None:
        if why is AudioClear.CUT and self._audio is not None:
            self._audio_done()  # cut by a barge-in: what was sent is all there is

    def _describe_formats(self, described: dict) -> None:
        audio = described.get("audio", {})
        audio.get("input", {})["format"] = self.input.describe()
        audio.get("output", {})["format"] = self.output.describe()

    def _audio_pending(self, event: ev.ResponseDone | ev.AudioTranscriptDone) -> bool:
        """Whether the event's response still has audio to send (so the event waits for it)."""
        response_id = event.response.id if isinstance(event, ev.ResponseDone) else event.response_id
        if self._audio is None or self._audio[0] != response_id:
            return False
        session = self.session
        if session is not None and session.playout.item_id == self._audio[1]:
            return True
        self._audio_done()  # its audio ended (cut or drained) before this event
        return False

    def _audio_done(self) -> None:
        assert self._audio is not None
        response_id, item_id = self._audio
        self._audio = None
        self._queue.put_nowait(ev.encode_event(self._stamped(iev.OutputAudioDone(response_id=response_id,
                                                                                 item_id=item_id))))
        held, self._held = self._held, []
        for event in held:
            self._queue.put_nowait(ev.encode_event(event))

    def _stamped(self, event: ev.ServerEvent) -> ev.ServerEvent:
        """The door's own events (audio) are numbered apart from the session's."""
        self._own_events += 1
        event.event_id = f"event_audio_{self._own_events}"
        return event

    # -- audio out ------------------------------------------------------------------------------
    async def _play(self, session: VoiceSession) -> None:
        async def tick(due: float) -> None:
            self._deliver(session, session.pull_frame(due))

        await FramePacer(WS_OUTPUT.frame_ms / 1000).run(tick)

    def _deliver(self, session: VoiceSession, frame: PulledFrame) -> None:
        if frame.item_id is None:
            return
        if frame.item_drained:
            if self._audio is not None and self._audio[1] == frame.item_id:
                self._audio_done()
            return
        response = session.response
        if response is None or response.item_id != frame.item_id:
            return
        if self._audio is None or self._audio[1] != frame.item_id:
            self._encoder = OutputEncoder(self.output)  # a new reply: no tail of the last one
        self._audio = (response.id, frame.item_id)
        encoded = self._encoder(frame.pcm)
        if not encoded or self._closing:
            return
        delta = base64.b64encode(encoded).decode("ascii")
        self._queue.put_nowait(ev.encode_event(self._stamped(
            iev.OutputAudioDelta(response_id=response.id, item_id=frame.item_id, delta=delta))))


async def refuse_rate_limited(ws: WebSocket, limited: RateLimited) -> None:
    """Turn a new connection away before it is accepted: HTTP 429 with Retry-After where the
    server can send one, else an ``error`` event and a close (1013: try again later)."""
    body = {"error": {"type": "rate_limit_error", "code": "rate_limited", "message": str(limited)}}
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse(body, 429, {"Retry-After": str(limited.retry_after)}))
        return
    await ws.accept()
    error = ev.ErrorEvent(error=ev.ErrorDetail(type="rate_limit_error", code="rate_limited", message=str(limited)),
                          event_id="event_refused")
    await ws.send_text(ev.encode_event(error))
    await ws.close(1013, "rate limited")


class AppendBudget:
    """A token bucket in seconds of audio: ``burst_s`` at once, refilled at ``rate`` seconds per
    second (a client may upload a recording faster than real time, but not without end)."""

    def __init__(self, burst_s: float, rate: float) -> None:
        self.burst_s, self.rate = burst_s, rate
        self._left = burst_s
        self._at: float | None = None

    def take(self, seconds: float, now: float) -> bool:
        if self._at is not None:
            self._left = min(self.burst_s, self._left + (now - self._at) * self.rate)
        self._at = now
        if seconds > self._left:
            return False
        self._left -= seconds
        return True


class RealtimeDoor:
    """The route's side: one ``RealtimeConnection`` per socket, counters for /duplex/stats."""

    def __init__(self, sessions: SessionManager, limits: RealtimeLimits) -> None:
        self.sessions = sessions
        self.limits = limits
        self.live: set[RealtimeConnection] = set()
        self.counters = {"connected": 0, "closed_by_limit": 0}

    async def serve(self, ws: WebSocket, settings: ev.SessionSettings | None = None,
                    pending: Pending = UNCOUNTED, owner: str | None = None) -> RealtimeConnection:
        """``pending``: the admission's hold on the caller's source, released at the client's
        first message (a socket that never speaks stays counted against its address); ``owner``:
        who opens it (``auth.owner_of``)."""
        connection = RealtimeConnection(ws, self.sessions, self.limits, settings, pending, owner)
        self.live.add(connection)
        self.counters["connected"] += 1
        try:
            await connection.run()
        finally:
            self.live.discard(connection)
            self.counters["closed_by_limit"] += connection.limit_hit
        return connection

    def stats(self) -> dict:
        return {"live_connections": len(self.live), "live_sessions": self.sessions.live("websocket"),
                **self.counters}

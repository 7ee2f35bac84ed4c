"""WebRTC calls in the OpenAI Realtime convention: an SDP offer in, an answer out; the caller's
audio into a session, the session's audio back; Realtime events on the ``oai-events`` channel."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import secrets
from collections import deque

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from duplex.edge.config import EdgeConfig
from duplex.edge.media import WEBRTC_OUTPUT, InputPump, SessionAudioTrack
from duplex.edge.rtc_options import receive_on_arrival, rtc_configuration
from duplex.edge.sdp import OfferError, check_offer
from duplex.session import events as ev
from duplex.session.manager import SessionManager
from duplex.session.observe import Refusal
from duplex.session.protocol import apply_settings, describe_session, handle_client_message
from duplex.session.session import VoiceSession

log = logging.getLogger("duplex.edge")
EVENTS_CHANNEL = "oai-events"
_MAX_MESSAGE_SIZE = re.compile(r"^a=max-message-size:\d+", re.MULTILINE)
FLUSH_S = 1.0  # how long a call's last error event may take to leave before the call is closed


def call_path_id(public_id: str, token: str) -> str:
    """The id a caller is given (in the Location): the public id (logs, metrics, recordings)
    and the call's secret, so only whoever got the Location hangs the call up."""
    return f"{public_id}_{token}"


def split_path_id(path_id: str) -> tuple[str, str]:
    """(public id, token) of a Location's id ('' when it carries none)."""
    public, sep, token = path_id.rpartition("_")
    return (public, token) if sep and public.startswith("rtc_") else (path_id, "")


class Call:
    """One peer connection and the session behind it."""

    def __init__(self, call_id: str, pc: RTCPeerConnection, max_pending: int) -> None:
        self.id = call_id
        self.token = secrets.token_hex(16)  # in the Location only (see call_path_id)
        self.pc = pc
        self.session: VoiceSession | None = None
        self.channel: RTCDataChannel | None = None
        self.pending: deque[ev.ServerEvent] = deque(maxlen=max_pending)
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    @property
    def path_id(self) -> str:
        return call_path_id(self.id, self.token)

    def owns(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token.encode())

    def send(self, event: ev.ServerEvent) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(ev.encode_event(event))
        else:
            self.pending.append(event)

    def spawn(self, coro, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class WebRTCGateway:
    def __init__(self, sessions: SessionManager, config: EdgeConfig) -> None:
        self.sessions = sessions
        self.config = config
        self.calls: dict[str, Call] = {}
        self.counters = {"offers": 0, "answered": 0, "bad_offers": 0, "connected": 0, "hung_up": 0,
                         "low_latency_receivers": 0, "not_connected": 0, "ended_at_max": 0, "failed": 0}

    async def answer(self, offer_sdp: str, settings: ev.SessionSettings | None = None) -> tuple[Call, str]:
        """Accept an offer: returns (the call, answer SDP). Raises SessionsFull, OfferError."""
        self.counters["offers"] += 1
        self.sessions.reserve()
        try:
            check_offer(offer_sdp)
            config = apply_settings(self.sessions.config, settings) if settings else None
        except ValueError as exc:
            self.counters["bad_offers"] += 1
            self.sessions.refused("webrtc", Refusal.BAD_REQUEST)
            raise OfferError(str(exc)) from None
        call = Call(f"rtc_{secrets.token_hex(16)}", RTCPeerConnection(rtc_configuration(self.config.ice_servers)),
                    self.config.max_pending_events)
        call.session = self.sessions.open("webrtc", call.send, WEBRTC_OUTPUT, config, call_id=call.id)
        self.calls[call.id] = call
        try:
            answer = await self._negotiate(call, offer_sdp)
        except Exception as exc:
            self.counters["bad_offers"] += 1
            await self.hang_up(call.id)
            raise OfferError(f"cannot answer this offer: {exc}") from None
        self.counters["answered"] += 1
        call.spawn(self._drop_if_unconnected(call), "connect-timeout")
        call.spawn(self._end_at_max(call), "max-call")
        return call, answer

    async def _negotiate(self, call: Call, offer_sdp: str) -> str:
        pc, session = call.pc, call.session
        assert session is not None
        pc.on("track", lambda track: self._on_track(call, track))
        pc.on("datachannel", lambda channel: self._on_channel(call, channel))
        pc.on("connectionstatechange", lambda: self._on_state(call))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        for transceiver in pc.getTransceivers():
            if transceiver.kind != "audio" or not self.config.low_latency_receive:
                continue
            if receive_on_arrival(transceiver.receiver):
                self.counters["low_latency_receivers"] += 1
        pc.addTrack(SessionAudioTrack(session.pull_output, WEBRTC_OUTPUT))
        await pc.setLocalDescription(await pc.createAnswer())
        # the largest data-channel message we take (aiortc advertises 256 KiB and reassembles
        # whatever arrives; a browser keeps to what the answer says)
        return _MAX_MESSAGE_SIZE.sub(f"a=max-message-size:{self.config.max_event_bytes}", pc.localDescription.sdp)

    def _on_track(self, call: Call, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and call.session is not None:
            call.spawn(InputPump(track, call.session.push_input, lambda exc: self._fail(call, exc)).run(), "input")

    def _fail(self, call: Call, exc: Exception) -> None:
        """The call broke inside the server: the client is told, and the call ends."""
        if call.session is not None:
            call.session.emit_error("server_error", f"the call failed: {exc!r}; it is ended", kind="server_error")
        self.counters["failed"] += 1
        asyncio.get_running_loop().create_task(self._end_after_flush(call))

    async def _end_after_flush(self, call: Call) -> None:
        await _flushed(call.channel)
        await self.hang_up(call.id)

    def _on_channel(self, call: Call, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or call.session is None or call.channel is not None:
            return
        session = call.session
        call.channel = channel
        channel.on("message", lambda message: handle_client_message(session, message, self.sessions.model,
                                                                        max_bytes=self.config.max_event_bytes))

        def opened() -> None:
            session.emit(ev.SessionCreated(session=describe_session(session, self.sessions.model)))
            while call.pending:
                channel.send(ev.encode_event(call.pending.popleft()))

        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)

    def _on_state(self, call: Call) -> None:
        state = call.pc.connectionState
        if state == "connected":
            self.counters["connected"] += 1
        elif state in ("failed", "closed") and not call.closed:
            asyncio.get_running_loop().create_task(self.hang_up(call.id))

    async def _drop_if_unconnected(self, call: Call) -> None:
        """The admission deadline: an answered offer holds a session slot only this long
        unless its media connects (half-open calls cannot keep real ones out)."""
        await asyncio.sleep(self.config.connect_timeout_s)
        if call.pc.connectionState != "connected" and not call.closed:
            log.info("call %s did not connect within %g s; dropping it", call.id, self.config.connect_timeout_s)
            self.counters["not_connected"] += 1
            await self.hang_up(call.id)

    async def _end_at_max(self, call: Call) -> None:
        await asyncio.sleep(self.config.max_call_s)
        if call.closed or call.session is None:
            return
        self.counters["ended_at_max"] += 1
        call.session.emit_error("session_expired", f"calls last at most {self.config.max_call_s:g} s "
                                                   "(max_call_s); this one has ended", kind="server_error")
        await self._end_after_flush(call)

    async def hang_up(self, call_id: str) -> bool:
        call = self.calls.pop(call_id, None)
        if call is None or call.closed:
            return False
        call.closed = True
        self.counters["hung_up"] += 1
        current = asyncio.current_task()
        for task in list(call.tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in call.tasks if t is not current), return_exceptions=True)
        if call.session is not None:
            await self.sessions.close(call.session)
        await call.pc.close()
        return True

    async def close_all(self) -> None:
        for call_id in list(self.calls):
            await self.hang_up(call_id)

    def stats(self) -> dict:
        return {"live_calls": len(self.calls), "live_sessions": self.sessions.live("webrtc"), **self.counters}


async def _flushed(channel: RTCDataChannel | None) -> None:
    """Until what was sent on ``channel`` has gone to the transport (at most FLUSH_S)."""
    if channel is None or channel.readyState != "open" or channel.bufferedAmount == 0:
        return
    drained = asyncio.Event()
    channel.once("bufferedamountlow", drained.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drained.wait(), FLUSH_S)

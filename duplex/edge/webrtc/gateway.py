"""WebRTC calls in the OpenAI Realtime convention: an SDP offer in, an answer out; the caller's
audio into a session, the session's audio back; Realtime events on the ``oai-events`` channel.
The peer connection itself (``rtc_peer.py``) runs in this process, or in a media worker process
(``media_pool.py``, ``edge.media_workers``): the gateway sees the same ``Peer`` either way."""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections import deque
from collections.abc import Callable

import numpy as np

from duplex.edge.config import EdgeConfig
from duplex.edge.rate import UNCOUNTED, Pending
from duplex.edge.webrtc.control import WebRtcCallControl
from duplex.edge.webrtc.media import WEBRTC_OUTPUT, paced_pull
from duplex.edge.webrtc.offer import OfferError, check_offer
from duplex.edge.webrtc.rtc_peer import Peer, PeerListener, RtcPeer
from duplex.session.door import SimpleDoor
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.observe import Refusal
from duplex.session.protocol import announce_session, apply_settings, handle_client_message
from duplex.session.realtime import events as ev
from duplex.session.recording import Opening
from duplex.session.session import VoiceSession

log = logging.getLogger("duplex.edge")
FLUSH_S = 1.0  # how long a call's last error event may take to leave before the call is closed

# makes a call's peer from the call's id, who to tell what happens and the session's output
# (``pull(due)``); raises SessionsFull when no peer can be made now
PeerMaker = Callable[[str, PeerListener, Callable[[float], np.ndarray]], Peer]


def local_peers(config: EdgeConfig) -> PeerMaker:
    """Peers on this process's event loop, paced by it."""
    return lambda call_id, listener, pull: RtcPeer(config, listener, paced_pull(pull))


def call_path_id(public_id: str, token: str) -> str:
    """The id a caller is given (in the Location): the public id (logs, metrics, recordings)
    and the call's secret, so only whoever got the Location hangs the call up."""
    return f"{public_id}_{token}"


def split_path_id(path_id: str) -> tuple[str, str]:
    """(public id, token) of a Location's id ('' when it carries none)."""
    public, sep, token = path_id.rpartition("_")
    return (public, token) if sep and public.startswith("rtc_") else (path_id, "")


class Call:
    """One peer connection and the session behind it; it hears its peer (``PeerListener``)."""

    def __init__(self, call_id: str, gateway: WebRTCGateway, connecting: Pending = UNCOUNTED) -> None:
        self.id = call_id
        self.connecting = connecting  # counts against the caller's source until the media connects
        self.token = secrets.token_hex(16)  # in the Location only (see call_path_id)
        self.gateway = gateway
        self.session: VoiceSession | None = None
        self.peer: Peer | None = None
        self.pending: deque[ev.ServerEvent] = deque(maxlen=gateway.config.max_pending_events)
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    @property
    def path_id(self) -> str:
        return call_path_id(self.id, self.token)

    @property
    def state(self) -> str:
        return self.peer.state if self.peer is not None else "new"

    def owns(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token.encode())

    def send(self, event: ev.ServerEvent) -> None:
        if self.peer is not None and self.peer.channel_open:
            self.peer.send(ev.encode_event(event))
        else:
            self.pending.append(event)

    def end(self, reason: str) -> None:
        """The conversation ends the call (``WebRtcCallControl``)."""
        if not self.closed:
            log.info("call %s ended by its conversation: %s", self.id, reason)
            self.spawn(self.gateway.end_after_flush(self), "end-call")

    def spawn(self, coro, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # what the peer tells the call
    def heard(self, pcm: np.ndarray, arrival: float, position: int | None) -> None:
        if self.session is None or self.closed:
            return
        try:
            self.session.push_input(pcm, arrival, position)
        except Exception as exc:
            log.exception("the session failed on the caller's audio")
            self.failed(repr(exc))

    def channel_opened(self) -> None:
        if self.session is None or self.peer is None:
            return
        announce_session(self.session, self.gateway.sessions.model)
        while self.pending and self.peer.channel_open:
            self.peer.send(ev.encode_event(self.pending.popleft()))

    def client_message(self, message: str | bytes) -> None:
        if self.session is not None and not self.closed:
            handle_client_message(self.session, message, self.gateway.sessions.model,
                                  max_bytes=self.gateway.config.max_event_bytes)

    def state_changed(self, state: str) -> None:
        if state == "connected":
            self.connecting.release()
            self.gateway.counters["connected"] += 1
        elif state in ("failed", "closed") and not self.closed:
            asyncio.get_running_loop().create_task(self.gateway.hang_up(self.id))

    def failed(self, reason: str) -> None:
        """The call broke inside the server: the client is told, and the call ends."""
        if self.closed:
            return
        if self.session is not None:
            self.session.emit_error("server_error", f"the call failed: {reason}; it is ended", kind="server_error")
        self.gateway.counters["failed"] += 1
        self.spawn(self.gateway.end_after_flush(self), "end")


class WebRTCGateway:
    def __init__(self, sessions: SessionManager, config: EdgeConfig, peers: PeerMaker | None = None) -> None:
        self.sessions = sessions
        self.config = config
        self.peers = peers or local_peers(config)
        self.calls: dict[str, Call] = {}
        self.counters = {"offers": 0, "answered": 0, "bad_offers": 0, "connected": 0, "hung_up": 0,
                         "low_latency_receivers": 0, "not_connected": 0, "ended_at_max": 0, "failed": 0}

    async def answer(self, offer_sdp: str, settings: ev.SessionSettings | None = None,
                     pending: Pending = UNCOUNTED, owner: str | None = None) -> tuple[Call, str]:
        """Accept an offer: returns (the call, answer SDP). Raises SessionsFull, OfferError.
        ``pending``: the admission's hold on the caller's source, released once the media
        connects or the call ends."""
        self.counters["offers"] += 1
        self.sessions.reserve()
        try:
            check_offer(offer_sdp)
            config = apply_settings(self.sessions.config, settings) if settings else None
        except ValueError as exc:
            self.counters["bad_offers"] += 1
            self.sessions.refused("webrtc", Refusal.BAD_REQUEST)
            raise OfferError(str(exc)) from None
        call = Call(f"rtc_{secrets.token_hex(16)}", self, pending)
        opening = Opening(owner, settings.recording if settings else None)
        door = SimpleDoor("webrtc", WEBRTC_OUTPUT, call.send, control=WebRtcCallControl(call.end))
        session = self.sessions.open(door, config, call_id=call.id,
                                     opening=opening)
        call.session = session
        self.calls[call.id] = call
        try:
            call.peer = self.peers(call.id, call, session.pull_output)
            answer = await call.peer.answer(offer_sdp)
        except SessionsFull as exc:  # the peer's, not the session manager's (it counts its own)
            self.sessions.refused("webrtc", exc.reason)
            await self.hang_up(call.id)
            raise
        except Exception as exc:
            self.counters["bad_offers"] += 1
            await self.hang_up(call.id)
            # the offer passed check_offer, so this is the WebRTC stack's own refusal; an assert
            # of its parser has no message, so the type at least is named
            raise OfferError(f"cannot answer this offer: {str(exc) or type(exc).__name__}") from None
        if call.peer.low_latency:
            self.counters["low_latency_receivers"] += 1
        self.counters["answered"] += 1
        call.spawn(self._drop_if_unconnected(call), "connect-timeout")
        call.spawn(self._end_at_max(call), "max-call")
        return call, answer

    async def end_after_flush(self, call: Call) -> None:
        if call.peer is not None:
            await call.peer.flush(FLUSH_S)
        await self.hang_up(call.id)

    async def _drop_if_unconnected(self, call: Call) -> None:
        """The admission deadline: an answered offer holds a session slot only this long
        unless its media connects (half-open calls cannot keep real ones out)."""
        await asyncio.sleep(self.config.connect_timeout_s)
        if call.state != "connected" and not call.closed:
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
        await self.end_after_flush(call)

    async def hang_up(self, call_id: str) -> bool:
        call = self.calls.pop(call_id, None)
        if call is None or call.closed:
            return False
        call.closed = True
        call.connecting.release()
        self.counters["hung_up"] += 1
        current = asyncio.current_task()
        for task in list(call.tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in call.tasks if t is not current), return_exceptions=True)
        if call.session is not None:
            await self.sessions.close(call.session)
        if call.peer is not None:
            await call.peer.close()
        return True

    async def close_all(self) -> None:
        for call_id in list(self.calls):
            await self.hang_up(call_id)

    def stats(self) -> dict:
        return {"live_calls": len(self.calls), "live_sessions": self.sessions.live("webrtc"), **self.counters}

"""One call's RTP leg: a UDP socket, the receive jitter buffer and the 20 ms media clock.

Every tick the leg plays out 20 ms of caller audio to the agent (silence for lost packets)
and sends 20 ms of agent audio to the phone (encoded silence while the agent is quiet), so the
far end hears a continuous stream with unbroken sequence numbers and timestamps.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from duplex.edge.media import g711
from duplex.edge.media.audio import PHONE_FRAME, PhoneDecoder, PhoneEncoder
from duplex.edge.media.dtmf import DtmfQueueFull, DtmfSender
from duplex.edge.media.jitter import JitterBuffer
from duplex.edge.media.rtp import DtmfEvent, RtpError, RtpPacketizer, parse_rtp
from duplex.edge.phone.bridge import CallAgent
from duplex.edge.sip.sdp import Negotiated
from duplex.session.call_control import CallAction, CallControlRefused
from duplex.session.pacing import FramePacer

log = logging.getLogger(__name__)
TICK_S = 0.020


@dataclass
class MediaStats:
    packets_received: int = 0
    packets_sent: int = 0
    malformed: int = 0
    wrong_source: int = 0
    wrong_payload_type: int = 0
    dtmf_in: int = 0  # keypad digits the caller pressed (RFC 4733 or SIP INFO)
    dtmf_sent: collections.deque[str] = field(default_factory=collections.deque)  # the last 64


class _RtpProtocol(asyncio.DatagramProtocol):
    media: CallMedia | None = None  # set once the socket is bound

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if self.media is not None:
            self.media.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("rtp socket error: %s", exc)  # ICMP port unreachable while the phone starts


class CallMedia:
    def __init__(self, transport: asyncio.DatagramTransport, jitter_depth: int,
                 symmetric: bool, rtp_timeout_s: float) -> None:
        self.transport = transport
        self.local_port: int = transport.get_extra_info("sockname")[1]
        self.stats = MediaStats()
        self.jitter = JitterBuffer(depth=jitter_depth)
        self.on_timeout: Callable[[], None] | None = None
        self.on_failure: Callable[[Exception], None] | None = None  # the conversation broke: end the call
        self._symmetric = symmetric
        self._rtp_timeout_s = rtp_timeout_s
        self._agreed: Negotiated | None = None
        self._agent: CallAgent | None = None
        self._decoder: PhoneDecoder | None = None
        self._encoder: PhoneEncoder | None = None
        self._packetizer: RtpPacketizer | None = None
        self._destination: tuple[str, int] | None = None
        self._latched = False  # sending follows the latched source (symmetric RTP only)
        self._source: tuple[str, int] | None = None  # the one source RTP is taken from
        self._talking = False
        self._seen_dtmf: set[int] = set()
        self._early_digits: list[str] = []
        self._dtmf_out = DtmfSender(PHONE_FRAME)
        self.stats.dtmf_sent = self._dtmf_out.sent
        self._last_rx = time.monotonic()
        self._task: asyncio.Task | None = None

    @classmethod
    async def open(cls, host: str, port_min: int, port_max: int, *, jitter_depth: int = 3,
                   symmetric: bool = False, rtp_timeout_s: float = 30.0) -> CallMedia:
        """Bind an even port in [port_min, port_max] (RFC 3550: RTP on even, RTCP on odd)."""
        loop = asyncio.get_running_loop()
        first = port_min + (port_min % 2)
        candidates = list(range(first, port_max + 1, 2))
        start = random.randrange(len(candidates))
        for port in candidates[start:] + candidates[:start]:
            try:
                transport, protocol = await loop.create_datagram_endpoint(
                    _RtpProtocol, local_addr=(host, port))
            except OSError:
                continue
            protocol.media = cls(transport, jitter_depth, symmetric, rtp_timeout_s)
            return protocol.media
        raise OSError(f"no free RTP port in {port_min}-{port_max}")

    def start(self, agent: CallAgent, agreed: Negotiated) -> None:
        self._agent = agent
        self.apply(agreed)
        agent.set_barge_in_listener(self._drop_queued_audio)
        for digit in self._early_digits:
            agent.dtmf(digit)
        self._early_digits.clear()
        self._last_rx = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._clock())

    def apply(self, agreed: Negotiated) -> None:
        """Use a (re)negotiated codec, address and direction."""
        codec_changed = self._agreed is None or self._agreed.codec != agreed.codec
        if self._agreed is not None and not self._symmetric and (
                (self._agreed.remote_address, self._agreed.remote_port)
                != (agreed.remote_address, agreed.remote_port)):
            self._source = None  # media moved (re-INVITE): latch afresh
        self._agreed = agreed
        if self._agent is not None and (codec_changed or self._decoder is None):
            self._decoder = PhoneDecoder(agreed.codec, self._agent.input_rate)
            self._encoder = PhoneEncoder(agreed.codec, self._agent.output_rate)
        if self._packetizer is None:
            self._packetizer = RtpPacketizer(agreed.payload_type, PHONE_FRAME)
        # a codec change (re-INVITE) keeps the stream: same SSRC, sequence and clock go on
        self._packetizer.payload_type = agreed.payload_type
        on_hold = agreed.remote_port == 0 or agreed.remote_address in ("0.0.0.0", "::")
        if not self._latched:
            self._destination = None if on_hold else (agreed.remote_address, agreed.remote_port)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.transport.close()

    def on_datagram(self, data: bytes, addr: tuple) -> None:
        agreed = self._agreed
        if agreed is None:
            return  # media not negotiated yet: nothing can be trusted
        if not self._source_ok(addr, agreed):
            self.stats.wrong_source += 1
            return
        try:
            packet = parse_rtp(data)
        except RtpError as exc:
            self.stats.malformed += 1
            log.info("dropped RTP datagram from %s: %s", addr[0], exc)
            return
        self._last_rx = time.monotonic()
        if packet.payload_type == agreed.payload_type:
            self.stats.packets_received += 1
            self.jitter.put(packet.sequence, packet.payload)
        elif packet.payload_type == agreed.dtmf_payload_type:
            self._on_dtmf(packet.timestamp, packet.payload)
        else:
            self.stats.wrong_payload_type += 1

    def _source_ok(self, addr: tuple, agreed: Negotiated) -> bool:
        """One source per call: the negotiated address and port, or else the first source
        seen from the negotiated address (any address with symmetric RTP, behind NAT),
        latched. Audio from any other port (a second socket on the caller's machine, a
        stranger) would otherwise reach the conversation as the caller's speech."""
        source = (addr[0], addr[1])
        negotiated = source == (agreed.remote_address, agreed.remote_port)
        if self._source is None and (negotiated or self._symmetric
                                     or addr[0] == agreed.remote_address):
            self._source = source
            if self._symmetric:  # comedia: answer where the phone sends from
                self._destination, self._latched = source, True
        elif negotiated and source != self._source and not self._symmetric:
            self._source = source  # the negotiated pair wins over a source latched before it
        return source == self._source
    def send_dtmf(self, digits: str) -> None:
        """Queue keypad digits for the far end (RFC 4733 events in this stream); refused when
        the peer offered no telephone-event or too many wait already."""
        agreed = self._agreed
        if agreed is None or agreed.dtmf_payload_type is None:
            raise CallControlRefused(CallAction.DTMF, "the far end did not offer telephone-event (RFC 4733) "
                                                      "in its SDP, so it cannot receive keypad digits")
        try:
            self._dtmf_out.queue(digits)
        except DtmfQueueFull as exc:
            raise CallControlRefused(CallAction.DTMF, str(exc)) from None

    def keypad(self, digit: str) -> None:
        """A digit the caller pressed, however it came (RFC 4733 here, SIP INFO in ``info``)."""
        self.stats.dtmf_in += 1
        if self._agent is not None:
            self._agent.dtmf(digit)
        elif len(self._early_digits) < 16:  # its session still opening: the digit waits
            self._early_digits.append(digit)

    def _on_dtmf(self, timestamp: int, payload: bytes) -> None:
        try:
            event = DtmfEvent.parse(payload)
        except RtpError as exc:
            self.stats.malformed += 1
            log.info("dropped telephone-event: %s", exc)
            return
        if event.end and timestamp not in self._seen_dtmf:  # the end packet is sent 3 times
            if len(self._seen_dtmf) > 64:
                self._seen_dtmf.clear()  # only the last event's repeats matter
            self._seen_dtmf.add(timestamp)
            self.keypad(event.digit)

    def _drop_queued_audio(self) -> None:
        if self._encoder is not None:
            self._encoder.clear()

    async def _clock(self) -> None:
        await FramePacer(TICK_S).run(self._tick)

    async def _tick(self, due: float) -> bool:
        """The caller's next 20 ms in, the agent's out; True when the call must end."""
        try:
            self._play_caller_audio()
            self._send_agent_audio(due)
        except Exception as exc:  # the call can neither hear nor speak any more: it must end
            log.exception("the call's conversation failed on its audio")
            if self.on_failure is not None:
                self.on_failure(exc)
            return True
        if self._timed_out():
            if self.on_timeout is not None:
                self.on_timeout()
            return True
        return False

    def _play_caller_audio(self) -> None:
        assert self._agent is not None and self._decoder is not None
        chunks, due = [], PHONE_FRAME
        while due > 0:  # a phone with another ptime sends other frame sizes: play by samples
            payload = self.jitter.pop()
            if payload is None:
                payload = bytes([g711.silence_byte(self._decoder.codec)]) * PHONE_FRAME
            chunks.append(payload)
            due -= len(payload) or PHONE_FRAME
        self._agent.caller_audio(self._decoder(b"".join(chunks)), time.monotonic())

    def _send_agent_audio(self, due: float) -> None:
        assert self._agent is not None and self._encoder is not None
        frame = self._agent.agent_audio(due)
        speaking = bool(np.any(frame))
        self._encoder.push(frame)
        payload = self._encoder.pop_frame() or self._encoder.silence()
        agreed = self._agreed
        if self._destination is None or agreed is None:
            return
        if agreed.direction not in ("sendrecv", "sendonly"):
            return  # on hold (or recvonly): the phone asked us not to send
        assert self._packetizer is not None
        event = self._dtmf_out.next(self._packetizer.timestamp) if agreed.dtmf_payload_type is not None else None
        if event is not None:  # a keypad digit goes in this tick's place (its audio is dropped)
            packet = self._packetizer.packetize(event.payload, event.marker, payload_type=agreed.dtmf_payload_type,
                                                timestamp=event.timestamp)
            self._talking = False
        else:
            packet = self._packetizer.packetize(payload, talkspurt_start=speaking and not self._talking)
            self._talking = speaking
        self.transport.sendto(packet, self._destination)
        self.stats.packets_sent += 1

    def _timed_out(self) -> bool:
        if self._rtp_timeout_s <= 0 or self._agreed is None:
            return False
        if self._agreed.direction in ("sendonly", "inactive"):
            return False  # on hold: the phone is not expected to send
        return time.monotonic() - self._last_rx > self._rtp_timeout_s

"""RTP (RFC 3550) packets, a packetizer with sequence/timestamp continuity, and DTMF events.

Only what a G.711 phone leg needs: fixed header, CSRCs and header extensions skipped, padding
honoured. Anything that does not parse raises ``RtpError``; the caller drops the datagram.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass

RTP_VERSION = 2
HEADER = struct.Struct("!BBHII")
MAX_DATAGRAM = 1500  # anything larger is not a 20 ms G.711 frame from a phone


class RtpError(ValueError):
    """A datagram that is not a usable RTP packet."""


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    def serialize(self) -> bytes:
        first = RTP_VERSION << 6
        second = (0x80 if self.marker else 0) | (self.payload_type & 0x7F)
        return HEADER.pack(first, second, self.sequence & 0xFFFF, self.timestamp & 0xFFFFFFFF,
                           self.ssrc & 0xFFFFFFFF) + self.payload


def parse_rtp(data: bytes) -> RtpPacket:
    if len(data) < HEADER.size:
        raise RtpError(f"datagram of {len(data)} bytes is shorter than an RTP header")
    if len(data) > MAX_DATAGRAM:
        raise RtpError(f"datagram of {len(data)} bytes is oversize")
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(f"RTP version {first >> 6}, expected 2")
    payload_type = second & 0x7F
    if 72 <= payload_type <= 76:
        raise RtpError(f"payload type {payload_type} is RTCP, not RTP")
    offset = HEADER.size + 4 * (first & 0x0F)
    if first & 0x10:  # header extension: 16-bit profile, 16-bit length in words
        if len(data) < offset + 4:
            raise RtpError("truncated header extension")
        (words,) = struct.unpack_from("!H", data, offset + 2)
        offset += 4 + 4 * words
    end = len(data)
    if first & 0x20:
        padding = data[-1]
        if padding == 0:
            raise RtpError("padding flag set with zero padding length")
        end -= padding
    if offset > end:
        raise RtpError("header fields run past the end of the datagram")
    return RtpPacket(payload_type, sequence, timestamp, ssrc, data[offset:end], bool(second & 0x80))


class RtpPacketizer:
    """Stamps outgoing payloads: sequence +1 per packet, timestamp + samples per packet.

    Random initial sequence, timestamp and SSRC (RFC 3550 §5.1). Timestamps advance through
    silence too (silence is sent, never skipped), so the far end's clock never jumps backwards.
    """

    def __init__(self, payload_type: int, samples_per_packet: int) -> None:
        self.payload_type = payload_type
        self.samples_per_packet = samples_per_packet
        self.ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._first = True
        self.packets_sent = 0

    @property
    def timestamp(self) -> int:
        """The next packet's timestamp."""
        return self._timestamp

    def packetize(self, payload: bytes, talkspurt_start: bool = False, *, payload_type: int | None = None,
                  timestamp: int | None = None) -> bytes:
        """The next packet; ``payload_type``/``timestamp`` given: a telephone-event in the same
        stream, its timestamp held at the event's start (the clock moves on all the same)."""
        packet = RtpPacket(self.payload_type if payload_type is None else payload_type, self._sequence,
                           self._timestamp if timestamp is None else timestamp, self.ssrc,
                           payload, marker=self._first or talkspurt_start)
        self._first = False
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._timestamp = (self._timestamp + self.samples_per_packet) & 0xFFFFFFFF
        self.packets_sent += 1
        return packet.serialize()


DTMF_EVENTS = "0123456789*#ABCD"


@dataclass(frozen=True)
class DtmfEvent:
    """An RFC 4733 telephone-event payload."""

    digit: str
    end: bool
    duration: int

    @classmethod
    def parse(cls, payload: bytes) -> DtmfEvent:
        if len(payload) < 4:
            raise RtpError("telephone-event payload shorter than 4 bytes")
        event, flags, duration = struct.unpack_from("!BBH", payload)
        if event >= len(DTMF_EVENTS):
            raise RtpError(f"telephone-event {event} is not a DTMF digit")
        return cls(DTMF_EVENTS[event], bool(flags & 0x80), duration)

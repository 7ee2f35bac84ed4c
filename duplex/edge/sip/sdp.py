"""SDP (RFC 4566) offer/answer (RFC 3264) for one G.711 audio stream.

We answer the first audio m-line with the first codec of the offer's order that we speak
(PCMU or PCMA at 8 kHz), plus telephone-event when offered; every other m-line is refused with
port 0, as the answer must mirror the offer's m-lines.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

MAX_SDP = 8192
STATIC_PAYLOADS = {0: ("PCMU", 8000), 8: ("PCMA", 8000)}
SUPPORTED = ("PCMU", "PCMA")
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")


class SdpError(ValueError):
    """An SDP body that cannot be understood."""


class NoCommonCodec(SdpError):
    """The offer is well-formed but shares no codec with us."""


@dataclass
class MediaLine:
    kind: str
    port: int
    proto: str
    formats: list[str]
    connection: str | None = None
    attributes: list[tuple[str, str]] = field(default_factory=list)

    def attribute(self, name: str) -> list[str]:
        return [value for key, value in self.attributes if key == name]

    def rtpmap(self) -> dict[int, tuple[str, int]]:
        mapping = {pt: codec for pt, codec in STATIC_PAYLOADS.items()}
        for value in self.attribute("rtpmap"):
            payload, _, encoding = value.partition(" ")
            name, _, rate = encoding.partition("/")
            if payload.isdigit() and rate.split("/")[0].isdigit():
                mapping[int(payload)] = (name.strip(), int(rate.split("/")[0]))
        return mapping

    def direction(self, session_default: str) -> str:
        found = [key for key, _ in self.attributes if key in DIRECTIONS]
        return found[-1] if found else session_default


@dataclass
class SessionDescription:
    origin: str
    connection: str | None
    media: list[MediaLine]
    direction: str = "sendrecv"


def parse_sdp(body: bytes) -> SessionDescription:
    if len(body) > MAX_SDP:
        raise SdpError(f"SDP of {len(body)} bytes is oversize")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SdpError("SDP is not UTF-8") from exc
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0":
        raise SdpError("SDP must start with v=0")
    origin, connection, direction = "", None, "sendrecv"
    media: list[MediaLine] = []
    for line in lines[1:]:
        if len(line) < 2 or line[1] != "=":
            raise SdpError(f"bad SDP line {line[:60]!r}")
        kind, value = line[0], line[2:]
        target = media[-1] if media else None
        if kind == "o":
            origin = value
        elif kind == "c":
            address = _connection_address(value)
            if target is None:
                connection = address
            else:
                target.connection = address
        elif kind == "m":
            media.append(_media_line(value))
        elif kind == "a":
            name, _, attr_value = value.partition(":")
            if target is not None:
                target.attributes.append((name, attr_value))
            elif name in DIRECTIONS:
                direction = name
    if not origin:
        raise SdpError("SDP has no o= line")
    return SessionDescription(origin, connection, media, direction)


def _connection_address(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"bad c= line {value[:60]!r}")
    address = parts[2].split("/")[0]
    try:
        ipaddress.ip_address(address)
    except ValueError as exc:
        raise SdpError(f"c= address {address!r} is not an IP address") from exc
    return address


def _media_line(value: str) -> MediaLine:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"bad m= line {value[:60]!r}")
    port_text = parts[1].split("/")[0]
    if not port_text.isdigit() or int(port_text) > 65535:
        raise SdpError(f"bad m= port {parts[1]!r}")
    return MediaLine(parts[0], int(port_text), parts[2], parts[3:])


@dataclass(frozen=True)
class Negotiated:
    """What both sides agreed for the audio stream."""

    codec: str
    payload_type: int
    dtmf_payload_type: int | None
    remote_address: str
    remote_port: int
    direction: str  # ours: what we do (the mirror of the offer's direction)
    ptime: int = 20


_MIRROR = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly",
           "inactive": "inactive"}


def negotiate(offer: SessionDescription, preferred: tuple[str, ...] = SUPPORTED) -> Negotiated:
    audio = next((m for m in offer.media if m.kind == "audio" and m.port != 0), None)
    if audio is None:
        raise NoCommonCodec("the offer has no active audio stream")
    if audio.proto.upper() not in ("RTP/AVP", "RTP/AVPF"):
        raise NoCommonCodec(f"transport {audio.proto} is not plain RTP")
    address = audio.connection or offer.connection
    if address is None:
        raise SdpError("no c= line for the audio stream")
    mapping = audio.rtpmap()
    chosen, dtmf = None, None
    for fmt in audio.formats:
        if not fmt.isdigit():
            continue
        name, rate = mapping.get(int(fmt), ("", 0))
        if chosen is None and name.upper() in preferred and rate == 8000:
            chosen = (name.upper(), int(fmt))
        elif dtmf is None and name.lower() == "telephone-event" and rate == 8000:
            dtmf = int(fmt)
    if chosen is None:
        raise NoCommonCodec(f"none of the offered formats {audio.formats} is PCMU/PCMA 8000")
    return Negotiated(chosen[0], chosen[1], dtmf, address, audio.port,
                      _MIRROR[audio.direction(offer.direction)])


@dataclass
class LocalDescription:
    """Our side of the session: origin ids stay fixed, the version bumps on every change."""

    address: str
    session_id: int = field(default_factory=lambda: secrets.randbits(31))
    version: int = 0
    _last: list[str] = field(default_factory=list)

    def answer(self, offer: SessionDescription, agreed: Negotiated, rtp_port: int) -> bytes:
        media_lines: list[str] = []
        answered = False
        for media in offer.media:
            if media.kind == "audio" and media.port != 0 and not answered:
                media_lines += self._audio_lines(rtp_port, agreed.payload_type, agreed.codec,
                                                 agreed.dtmf_payload_type, agreed.direction)
                answered = True
            else:
                media_lines.append(f"m={media.kind} 0 {media.proto} {' '.join(media.formats)}")
        return self._render(media_lines)

    def offer(self, rtp_port: int) -> bytes:
        """A full offer (for an INVITE that came without one): both codecs and DTMF."""
        return self._render([f"m=audio {rtp_port} RTP/AVP 0 8 101", "a=rtpmap:0 PCMU/8000",
                             "a=rtpmap:8 PCMA/8000", "a=rtpmap:101 telephone-event/8000",
                             "a=fmtp:101 0-15", "a=ptime:20", "a=sendrecv"])

    def _render(self, media_lines: list[str]) -> bytes:
        family = "IP6" if ":" in self.address else "IP4"
        rest = ["s=duplex", f"c=IN {family} {self.address}", "t=0 0", *media_lines]
        if rest != self._last:  # RFC 3264 §8: the version changes only when the session does
            self.version += 1
            self._last = rest
        origin = f"o=duplex {self.session_id} {self.version} IN {family} {self.address}"
        return ("\r\n".join(["v=0", origin, *rest]) + "\r\n").encode()

    @staticmethod
    def _audio_lines(port: int, payload_type: int, codec: str, dtmf: int | None,
                     direction: str) -> list[str]:
        formats = f"{payload_type}" + (f" {dtmf}" if dtmf is not None else "")
        lines = [f"m=audio {port} RTP/AVP {formats}", f"a=rtpmap:{payload_type} {codec}/8000"]
        if dtmf is not None:
            lines += [f"a=rtpmap:{dtmf} telephone-event/8000", f"a=fmtp:{dtmf} 0-15"]
        return lines + ["a=ptime:20", f"a={direction}"]

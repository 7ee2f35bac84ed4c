"""The Twilio Media Streams WebSocket protocol as typed messages (msgspec, JSON text frames).

Inbound (the provider to us): connected, start, media (base64 mu-law 8 kHz), mark (an echo
of our mark once its audio has played), dtmf, stop. Outbound (us to the provider): media,
mark, clear (drop the audio queued for the caller: sent on barge-in). Field names are the
provider's (camelCase); numbers it sends as strings stay strings.
"""

from __future__ import annotations

import base64

import msgspec

INBOUND_TRACK = "inbound"
MULAW_ENCODING = "audio/x-mulaw"


class _In(msgspec.Struct, tag_field="event", kw_only=True):
    sequenceNumber: str = ""
    streamSid: str = ""


class Connected(_In, tag="connected"):
    protocol: str = "Call"
    version: str = "1.0.0"


class MediaFormat(msgspec.Struct):
    encoding: str = MULAW_ENCODING
    sampleRate: int = 8000
    channels: int = 1


class StartInfo(msgspec.Struct, kw_only=True):
    streamSid: str = ""
    accountSid: str = ""
    callSid: str = ""
    tracks: list[str] = msgspec.field(default_factory=lambda: [INBOUND_TRACK])
    customParameters: dict[str, str] = msgspec.field(default_factory=dict)
    mediaFormat: MediaFormat = msgspec.field(default_factory=MediaFormat)


class Start(_In, tag="start"):
    start: StartInfo


class InboundMedia(msgspec.Struct, kw_only=True):
    payload: str
    track: str = INBOUND_TRACK
    chunk: str = ""
    timestamp: str = ""


class Media(_In, tag="media"):
    media: InboundMedia


class MarkInfo(msgspec.Struct):
    name: str


class Mark(_In, tag="mark"):
    mark: MarkInfo


class DtmfInfo(msgspec.Struct, kw_only=True):
    digit: str
    track: str = "inbound_track"


class Dtmf(_In, tag="dtmf"):
    dtmf: DtmfInfo


class StopInfo(msgspec.Struct, kw_only=True):
    accountSid: str = ""
    callSid: str = ""


class Stop(_In, tag="stop"):
    stop: StopInfo = msgspec.field(default_factory=StopInfo)


Inbound = Connected | Start | Media | Mark | Dtmf | Stop


class _Out(msgspec.Struct, tag_field="event", kw_only=True):
    streamSid: str


class OutboundPayload(msgspec.Struct):
    payload: str


class OutMedia(_Out, tag="media"):
    media: OutboundPayload


class OutMark(_Out, tag="mark"):
    mark: MarkInfo


class Clear(_Out, tag="clear"):
    pass


Outbound = OutMedia | OutMark | Clear

_inbound = msgspec.json.Decoder(Inbound)
_encoder = msgspec.json.Encoder()


def decode_inbound(text: str | bytes) -> Inbound:
    """Raises msgspec.DecodeError / ValidationError (both msgspec.MsgspecError) on bad input."""
    return _inbound.decode(text)


def encode(message: msgspec.Struct) -> str:
    return _encoder.encode(message).decode()


def b64encode(payload: bytes) -> str:
    return base64.b64encode(payload).decode("ascii")


def b64decode(text: str) -> bytes:
    """Strict base64 (raises binascii.Error on anything else)."""
    return base64.b64decode(text, validate=True)

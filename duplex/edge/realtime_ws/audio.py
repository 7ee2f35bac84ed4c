"""Audio formats of the Realtime WebSocket: base64 ``audio/pcm`` (16-bit mono 24 kHz),
``audio/pcmu`` and ``audio/pcma`` (G.711 at 8 kHz), in both directions, and the beta names of
the same formats (``pcm16``, ``g711_ulaw``, ``g711_alaw``).

Caller audio is converted to the session's 16 kHz int16; the session plays agent audio at 24 kHz
mono (``WS_OUTPUT``), converted here to the output format per frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duplex.audio import SESSION_RATE, Resampler
from duplex.edge.media import g711
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.realtime.client_items import ItemError

WS_OUTPUT = OutputFormat(sample_rate=24000, channels=1, frame_ms=20)
_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
_CODECS = {"audio/pcmu": "PCMU", "audio/pcma": "PCMA"}
BETA_NAMES = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


@dataclass(frozen=True)
class Format:
    type: str = "audio/pcm"

    @property
    def rate(self) -> int:
        return _RATES[self.type]

    @property
    def bytes_per_second(self) -> int:
        return self.rate * (2 if self.type == "audio/pcm" else 1)

    def describe(self) -> dict:
        return {"type": self.type, "rate": self.rate}


def parse_format(value: ev.AudioFormat | str | None, where: str) -> Format | None:
    """A client's format (GA object or beta name); None when not given. Raises ValueError."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in BETA_NAMES:
            raise ValueError(f"{where}: unknown format {value!r} (known: {', '.join(BETA_NAMES)})")
        return Format(BETA_NAMES[value])
    if value.type not in _RATES:
        raise ValueError(f"{where}.type {value.type!r}: audio/pcm, audio/pcmu or audio/pcma")
    if value.rate is not None and value.rate != _RATES[value.type]:
        raise ValueError(f"{where}.rate {value.rate}: {value.type} is {_RATES[value.type]} Hz here")
    return Format(value.type)


class InputDecoder:
    """Encoded caller audio -> int16 mono at the session rate (stateful: no seams between appends)."""

    def __init__(self, fmt: Format) -> None:
        self.format = fmt
        self._resampler = Resampler(SESSION_RATE)

    def __call__(self, data: bytes) -> np.ndarray:
        if self.format.type == "audio/pcm":
            if len(data) % 2:
                raise ItemError("invalid_audio", f"audio/pcm is 16-bit samples: {len(data)} bytes is an odd count")
            pcm = np.frombuffer(data, "<i2").astype(np.int16)
        else:
            pcm = g711.decode(data, _CODECS[self.format.type])
        return self._resampler(pcm, self.format.rate)


class OutputEncoder:
    """Frames of int16 mono 24 kHz (``WS_OUTPUT``) -> bytes in the output format, whole 20 ms
    frames only (a resampler's output runs a little behind its input: the rest waits a frame)."""

    def __init__(self, fmt: Format) -> None:
        self.format = fmt
        self._resampler = Resampler(fmt.rate) if fmt.rate != WS_OUTPUT.sample_rate else None
        self._frame = fmt.rate * WS_OUTPUT.frame_ms // 1000
        self._carry = np.zeros(0, np.int16)

    def __call__(self, pcm: np.ndarray) -> bytes:
        if self._resampler is not None:
            pcm = np.concatenate([self._carry, self._resampler(pcm, WS_OUTPUT.sample_rate)])
            whole = len(pcm) - len(pcm) % self._frame
            pcm, self._carry = pcm[:whole], pcm[whole:]
        if self.format.type == "audio/pcm":
            return np.ascontiguousarray(pcm, "<i2").tobytes()
        return g711.encode(pcm, _CODECS[self.format.type])


def formats_of(settings: ev.SessionSettings) -> tuple[Format | None, Format | None]:
    """(input, output) formats a session.update asks for, GA or beta shape. Raises ValueError."""
    audio = settings.audio
    given_in = audio.input.format if audio is not None and audio.input is not None else None
    given_out = audio.output.format if audio is not None and audio.output is not None else None
    return (parse_format(given_in or settings.input_audio_format, "audio.input.format"),
            parse_format(given_out or settings.output_audio_format, "audio.output.format"))

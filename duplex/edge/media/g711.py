"""G.711 mu-law and A-law codecs as numpy lookup tables (ITU-T G.711).

Decoding follows the standard's segment formulas (one lookup per byte). The encoder is derived
from the decoder: each 16-bit value maps to the code whose reconstruction level is nearest, which
is what the standard's decision levels (midpoints between levels) say. Encoding is one lookup
per sample (int16 viewed as uint16 indexes a 65536-entry table).
"""

from __future__ import annotations

import numpy as np

_MULAW_BIAS = 0x84


def _mulaw_levels() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = (((mantissa << 3) + _MULAW_BIAS) << exponent) - _MULAW_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_levels() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    base = (code & 0x0F) << 4
    magnitude = np.where(segment == 0, base + 8, (base + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


def _nearest_code_table(levels: np.ndarray) -> np.ndarray:
    # Ties go to the higher level, so zero encodes as the conventional silence words: mu-law's
    # +0 (0xFF, sorted after its twin -0 = 0x7F) and A-law's +8 (0xD5).
    order = np.argsort(levels.astype(np.int32) * 2 + (np.arange(256) >= 128), kind="stable")
    values = levels[order].astype(np.int32)
    midpoints = (values[:-1] + values[1:]) / 2.0
    pcm = np.arange(-32768, 32768, dtype=np.int32)
    nearest = order[np.searchsorted(midpoints, pcm, side="right")]
    table = np.empty(65536, dtype=np.uint8)
    table[pcm.astype(np.int16).view(np.uint16)] = nearest.astype(np.uint8)
    return table


_DECODE = {"PCMU": _mulaw_levels(), "PCMA": _alaw_levels()}
_ENCODE = {name: _nearest_code_table(levels) for name, levels in _DECODE.items()}
CODECS = tuple(_ENCODE)


def encode(pcm: np.ndarray, codec: str) -> bytes:
    """int16 samples -> G.711 bytes (one byte per sample)."""
    samples = np.ascontiguousarray(pcm, dtype=np.int16)
    return _ENCODE[codec][samples.view(np.uint16)].tobytes()


def decode(payload: bytes, codec: str) -> np.ndarray:
    """G.711 bytes -> int16 samples."""
    return _DECODE[codec][np.frombuffer(payload, dtype=np.uint8)]


def silence_byte(codec: str) -> int:
    """The code word for digital zero (0xFF in mu-law, 0xD5 in A-law)."""
    return int(_ENCODE[codec][0])


def float_to_int16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


"""G.711 at the phone's 8 kHz <-> int16 mono at the session's rates.

One converter per direction per call (``duplex.audio.Resampler`` keeps its filter state between
frames, so a stream of 20 ms frames converts without seams). Everything is int16 mono.
"""

from __future__ import annotations

import numpy as np

from duplex.audio import Resampler
from duplex.edge.media import g711

PHONE_RATE = 8000
FRAME_MS = 20
PHONE_FRAME = PHONE_RATE * FRAME_MS // 1000  # 160 samples = 160 G.711 bytes


class PhoneDecoder:
    """G.711 payloads -> int16 mono at the session's rate."""

    def __init__(self, codec: str, out_rate: int) -> None:
        self.codec = codec
        self._resample = Resampler(out_rate)

    def __call__(self, payload: bytes) -> np.ndarray:
        return self._resample(g711.decode(payload, self.codec), PHONE_RATE)


class PhoneEncoder:
    """int16 mono at the agent's rate -> G.711 payloads of exactly 20 ms."""

    def __init__(self, codec: str, in_rate: int) -> None:
        self.codec = codec
        self.in_rate = in_rate
        self._resample = Resampler(PHONE_RATE)
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: np.ndarray) -> None:
        self._pending = np.concatenate([self._pending, self._resample(pcm, self.in_rate)])

    def pop_frame(self) -> bytes | None:
        if len(self._pending) < PHONE_FRAME:
            return None
        frame, self._pending = self._pending[:PHONE_FRAME], self._pending[PHONE_FRAME:]
        return g711.encode(frame, self.codec)

    def clear(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)

    def silence(self) -> bytes:
        return bytes([g711.silence_byte(self.codec)]) * PHONE_FRAME

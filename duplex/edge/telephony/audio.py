"""Rate conversion between the phone's 8 kHz G.711 and the session's rates (PyAV's resampler).

One converter per direction per call: the resampler keeps its filter state between frames,
so a stream of 20 ms frames converts without seams. Everything is int16 mono.
"""

from __future__ import annotations

import av
import numpy as np

from duplex.edge.telephony import g711

PHONE_RATE = 8000
FRAME_MS = 20
PHONE_FRAME = PHONE_RATE * FRAME_MS // 1000  # 160 samples = 160 G.711 bytes


class Resampler:
    """int16 mono at ``in_rate`` -> int16 mono at ``out_rate``, streaming."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._resampler = (av.AudioResampler(format="s16", layout="mono", rate=out_rate)
                           if in_rate != out_rate else None)

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        samples = np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1)
        if self._resampler is None or samples.shape[1] == 0:
            return samples[0].copy()
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.in_rate
        chunks = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


class PhoneDecoder:
    """G.711 payloads -> int16 mono at the session's rate."""

    def __init__(self, codec: str, out_rate: int) -> None:
        self.codec = codec
        self._resample = Resampler(PHONE_RATE, out_rate)

    def __call__(self, payload: bytes) -> np.ndarray:
        return self._resample(g711.decode(payload, self.codec))


class PhoneEncoder:
    """int16 mono at the agent's rate -> G.711 payloads of exactly 20 ms."""

    def __init__(self, codec: str, in_rate: int) -> None:
        self.codec = codec
        self._resample = Resampler(in_rate, PHONE_RATE)
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: np.ndarray) -> None:
        self._pending = np.concatenate([self._pending, self._resample(pcm)])

    def pop_frame(self) -> bytes | None:
        if len(self._pending) < PHONE_FRAME:
            return None
        frame, self._pending = self._pending[:PHONE_FRAME], self._pending[PHONE_FRAME:]
        return g711.encode(frame, self.codec)

    def clear(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)

    def silence(self) -> bytes:
        return bytes([g711.silence_byte(self.codec)]) * PHONE_FRAME

"""Sample-rate conversion for float32 mono audio, through PyAV's resampler (libswresample)."""

from __future__ import annotations

import av
import numpy as np


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Float32 mono ``audio`` at ``from_rate`` -> float32 mono at ``to_rate`` (whole clip)."""
    audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    if from_rate == to_rate or audio.size == 0:
        return audio.copy()
    frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
    frame.sample_rate = from_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to_rate)
    pieces = [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
    pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]  # drain the tail
    return np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)

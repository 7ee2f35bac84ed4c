"""Sample-rate and channel conversion of PCM audio: the one wrapper around PyAV's resampler
(libswresample), below every layer, so the edge, the session, the model families and the tools
share it, with the session rate (``SESSION_RATE``). It imports nothing of duplex.

``Resampler`` is for streams: it keeps the filter's state between calls, so a stream of 20 ms
frames converts without seams; ``flush`` returns the filter's tail at the end of the stream.
``resample`` converts a whole clip at once.

Samples are numpy arrays, interleaved when they have more than one channel: int16 (``s16``) or
float32 in [-1, 1] (``flt``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

# PyAV loads with the first Resampler: the runtime contract imports this module for SESSION_RATE,
# and a GPU host that runs only model stages need not have PyAV.
if TYPE_CHECKING:
    import av

SESSION_RATE = 16000  # caller audio, in the session and into the first stage: 16 kHz mono

_FORMATS = {np.dtype(np.int16): "s16", np.dtype(np.float32): "flt"}
_LAYOUTS = {1: "mono", 2: "stereo"}


class Resampler:
    """Audio of any rate and channel count -> ``out_dtype`` at ``out_rate`` with ``out_channels``."""

    def __init__(self, out_rate: int, out_channels: int = 1, out_dtype: type = np.int16) -> None:
        self.out_rate = out_rate
        self.out_channels = out_channels
        self.out_dtype = np.dtype(out_dtype)
        import av

        self._av = av
        self._resampler = av.AudioResampler(format=_FORMATS[self.out_dtype], layout=_LAYOUTS[out_channels],
                                            rate=out_rate)

    def __call__(self, samples: np.ndarray, rate: int, channels: int = 1) -> np.ndarray:
        """``samples`` (int16 or float32, interleaved) at ``rate`` -> the output format."""
        pcm = np.asarray(samples)
        if pcm.dtype.kind == "f" and pcm.dtype != np.float32:
            pcm = pcm.astype(np.float32)
        if pcm.dtype not in _FORMATS:  # a silent int32 -> float cast would be off by 2**16
            raise TypeError(f"PCM must be int16 or float32, not {pcm.dtype}")
        pcm = np.ascontiguousarray(pcm).reshape(1, -1)
        if pcm.shape[1] == 0:
            return np.zeros(0, self.out_dtype)
        frame = self._av.AudioFrame.from_ndarray(pcm, format=_FORMATS[pcm.dtype], layout=_LAYOUTS[channels])
        frame.sample_rate = rate
        return self.frame(frame)

    def frame(self, frame: av.AudioFrame) -> np.ndarray:
        """A decoded PyAV frame, in whatever rate, layout and format it came -> the output format."""
        return self._joined(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """The end of the stream: what the filter still holds."""
        return self._joined(self._resampler.resample(None))

    def _joined(self, frames: list[av.AudioFrame]) -> np.ndarray:
        chunks = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(chunks) if chunks else np.zeros(0, self.out_dtype)


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """A whole float32 mono clip at ``from_rate`` -> float32 mono at ``to_rate`` (tail included)."""
    clip = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    if from_rate == to_rate or clip.size == 0:
        return clip.copy()
    resampler = Resampler(to_rate, out_dtype=np.float32)
    return np.concatenate([resampler(clip, from_rate), resampler.flush()])

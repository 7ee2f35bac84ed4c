"""Whisper log-mel features computed incrementally as audio arrives.

Same numbers as ``WhisperFeatureExtractor`` on the whole utterance (128 bins, 16 kHz, 25 ms
window, 10 ms hop, reflect padding at both ends, the STFT's last frame dropped): frame ``t`` is
centred on sample ``160 t`` and needs samples up to ``160 t + 200``, so it is computed as soon as
those have arrived; the frames touching the end wait for the end of the utterance.

Whisper floors every value at (utterance maximum - 8). The maximum is only known at the end, so
``floor()`` reports the maximum so far and callers that already used an older floor can tell
whether it moved (see ``encoder.StreamingAudioEncoder``).
"""

from __future__ import annotations

import numpy as np
import torch

N_FFT, HOP, SAMPLE_RATE = 400, 160, 16000
_HALF = N_FFT // 2


def mel_filters(num_mel_bins: int = 128) -> torch.Tensor:
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=num_mel_bins, sampling_rate=SAMPLE_RATE)
    return torch.from_numpy(np.asarray(extractor.mel_filters, dtype=np.float32))  # (freq, mel)


def normalize(log_mel: torch.Tensor, floor: float) -> torch.Tensor:
    return (torch.clamp(log_mel, min=floor) + 4.0) / 4.0


class StreamingLogMel:
    def __init__(self, filters: torch.Tensor) -> None:
        self._filters_t = filters.T.contiguous()
        self._window = torch.hann_window(N_FFT)
        self._audio = np.zeros(0, dtype=np.float32)
        self._frames: list[torch.Tensor] = []  # unfloored log10 mel, (mel, n) pieces
        self.num_frames = 0
        self.max_value = -np.inf
        self.ended = False

    def push(self, audio: np.ndarray, final: bool = False) -> torch.Tensor:
        """Add samples; return the newly completed unfloored log-mel frames, (mel, n)."""
        if self.ended:
            raise ValueError("audio pushed after the end of the utterance")
        self._audio = np.concatenate([self._audio, np.asarray(audio, dtype=np.float32).reshape(-1)])
        self.ended = final
        total = len(self._audio) // HOP if final else max(0, (len(self._audio) - _HALF) // HOP)
        if final and len(self._audio) <= _HALF:
            raise ValueError(f"utterance too short: {len(self._audio)} samples (reflect padding needs > {_HALF})")
        if total <= self.num_frames or len(self._audio) <= _HALF:
            return torch.zeros(self._filters_t.shape[0], 0)
        frames = self._compute(self.num_frames, total)
        self.num_frames = total
        self._frames.append(frames)
        if frames.numel():
            self.max_value = max(self.max_value, float(frames.max()))
        return frames

    def floor(self) -> float:
        return self.max_value - 8.0

    def frames(self, start: int, stop: int) -> torch.Tensor:
        every = torch.cat(self._frames, dim=1) if len(self._frames) > 1 else self._frames[0]
        self._frames = [every]
        return every[:, start:stop]

    def _compute(self, first: int, stop: int) -> torch.Tensor:
        audio = self._audio
        padded_start = np.concatenate([audio[1 : _HALF + 1][::-1], audio])
        if self.ended:
            padded_start = np.concatenate([padded_start, audio[-_HALF - 1 : -1][::-1]])
        # Frame t covers padded samples [160 t, 160 t + 400).
        segment = torch.from_numpy(np.ascontiguousarray(padded_start[first * HOP : (stop - 1) * HOP + N_FFT]))
        spec = torch.stft(segment, N_FFT, HOP, window=self._window, center=False, return_complex=True)
        power = (spec.abs() ** 2).contiguous()
        return torch.clamp(self._filters_t @ power, min=1e-10).log10()

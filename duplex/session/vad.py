"""Voice activity, one decision per frame: ``FrameClassifier`` says whether a frame is voiced
(webrtcvad, gated by level against an adaptive noise floor). Turns are made of those decisions in
``duplex.session.turns``."""

from __future__ import annotations

import numpy as np
import webrtcvad

from duplex.audio import SESSION_RATE
from duplex.config.session import VadConfig

_SILENCE_DBFS = -120.0
_FLOOR_RISE_DB_PER_S = 3.0  # a louder room raises the floor slowly; a quiet moment drops it at once


def level_dbfs(frame: np.ndarray) -> float:
    """RMS level of int16 samples relative to full scale."""
    if frame.size == 0:
        return _SILENCE_DBFS
    rms = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) / 32768.0
    return 20.0 * np.log10(rms) if rms > 1e-6 else _SILENCE_DBFS


class FrameClassifier:
    def __init__(self, config: VadConfig) -> None:
        self.config = config
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._floor_dbfs = self._lowest_floor_dbfs
        self._rise_per_frame = _FLOOR_RISE_DB_PER_S * config.frame_ms / 1000.0

    @property
    def frame_samples(self) -> int:
        return SESSION_RATE * self.config.frame_ms // 1000

    def set_aggressiveness(self, aggressiveness: int) -> None:
        self._vad.set_mode(aggressiveness)

    def is_voiced(self, frame: np.ndarray) -> bool:
        """``frame``: int16 mono 16 kHz, exactly ``frame_samples`` long."""
        level = level_dbfs(frame)
        loud_enough = level >= max(self.config.min_level_dbfs, self._floor_dbfs + self.config.floor_margin_db)
        self._track_floor(level)
        return loud_enough and self._vad.is_speech(frame.tobytes(), SESSION_RATE)

    @property
    def _lowest_floor_dbfs(self) -> float:
        """Below this floor the gate is ``min_level_dbfs`` alone. The floor stops here: a very quiet
        moment (digital silence: a hole in the stream filled with zeros, a muted line, a fake
        microphone) would otherwise drop it to -120 dBFS, and at the floor's slow rise a noise that
        starts after it would clear the gate for ~25 s."""
        return self.config.min_level_dbfs - self.config.floor_margin_db

    def _track_floor(self, level: float) -> None:
        if level < self._floor_dbfs:
            self._floor_dbfs = max(level, self._lowest_floor_dbfs)
        else:
            self._floor_dbfs += self._rise_per_frame

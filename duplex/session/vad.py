"""Voice activity: per-frame classification and turn hysteresis.

``FrameClassifier`` says whether one frame is voiced (webrtcvad, gated by level against an
adaptive noise floor). ``TurnDetector`` turns the voiced/unvoiced stream into speech start and
stop events: start after ``min_speech_ms`` of voiced audio within ``start_window_ms``, stop after
``silence_ms`` of unvoiced audio. Given a ``pause_ms`` shorter than that, it also says when the
speaker pauses (that much silence, the turn not yet over) and when they resume after a pause:
the cues of preemptive generation. Both work on stream time (ms of audio pushed), never wall time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad

from duplex.session.config import VadConfig

SAMPLE_RATE = 16000
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
        self._floor_dbfs = config.min_level_dbfs - config.floor_margin_db
        self._rise_per_frame = _FLOOR_RISE_DB_PER_S * config.frame_ms / 1000.0

    @property
    def frame_samples(self) -> int:
        return SAMPLE_RATE * self.config.frame_ms // 1000

    @property
    def noise_floor_dbfs(self) -> float:
        return self._floor_dbfs

    def set_aggressiveness(self, aggressiveness: int) -> None:
        self._vad.set_mode(aggressiveness)

    def is_voiced(self, frame: np.ndarray) -> bool:
        """``frame``: int16 mono 16 kHz, exactly ``frame_samples`` long."""
        level = level_dbfs(frame)
        loud_enough = level >= max(self.config.min_level_dbfs, self._floor_dbfs + self.config.floor_margin_db)
        self._track_floor(level)
        return loud_enough and self._vad.is_speech(frame.tobytes(), SAMPLE_RATE)

    def _track_floor(self, level: float) -> None:
        if level < self._floor_dbfs:
            self._floor_dbfs = max(level, _SILENCE_DBFS)
        else:
            self._floor_dbfs += self._rise_per_frame


@dataclass(frozen=True)
class SpeechStarted:
    onset_ms: int  # stream time of the first voiced frame of the speech


@dataclass(frozen=True)
class SpeechStopped:
    end_ms: int  # stream time just after the last voiced frame


@dataclass(frozen=True)
class SpeechPaused:
    end_ms: int  # stream time just after the last voiced frame; the turn may still go on


@dataclass(frozen=True)
class SpeechResumed:
    at_ms: int  # stream time of the voiced frame that ended the pause


TurnEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


class TurnDetector:
    def __init__(self, config: VadConfig, pause_ms: int | None = None) -> None:
        self.config = config
        self.pause_ms = pause_ms  # None: no pause events
        self.speaking = False
        self.paused = False  # a SpeechPaused was reported and no voiced frame came since
        self._window: deque[tuple[int, bool]] = deque(maxlen=max(1, config.start_window_ms // config.frame_ms))
        self._unvoiced_ms = 0
        self._last_voiced_end_ms = 0

    def push(self, frame_start_ms: int, voiced: bool) -> TurnEvent | None:
        """One frame's verdict; returns the event this frame completes, if any."""
        frame_ms = self.config.frame_ms
        self._window.append((frame_start_ms, voiced))
        if voiced:
            self._unvoiced_ms = 0
            self._last_voiced_end_ms = frame_start_ms + frame_ms
            if self.paused:
                self.paused = False
                return SpeechResumed(at_ms=frame_start_ms)
        else:
            self._unvoiced_ms += frame_ms
        if not self.speaking:
            voiced_ms = frame_ms * sum(1 for _, v in self._window if v)
            if voiced_ms >= self.config.min_speech_ms:
                self.speaking = True
                onset = next(start for start, v in self._window if v)
                return SpeechStarted(onset_ms=onset)
            return None
        if self._unvoiced_ms >= self.config.silence_ms:
            self.speaking = self.paused = False
            self._window.clear()
            return SpeechStopped(end_ms=self._last_voiced_end_ms)
        if self.pause_ms is not None and not self.paused and self._unvoiced_ms >= self.pause_ms:
            self.paused = True
            return SpeechPaused(end_ms=self._last_voiced_end_ms)
        return None

    def reset(self) -> None:
        self.speaking = self.paused = False
        self._window.clear()
        self._unvoiced_ms = 0

"""The caller's audio around a turn, as frames with the session's voiced verdict on each: the
last few frames before it (the prefix padding joins the turn at its onset), the part not yet
fed to the runtime, and the whole turn so far (a fresh request after a cancelled speculation
replays it). Hands audio out as ``CallerAudio``, so no stage runs a VAD of its own again."""

from __future__ import annotations

from collections import deque

import numpy as np

from duplex.config.session import VadConfig
from duplex.runtime.contract import CallerAudio

Frame = tuple[np.ndarray, bool]  # int16 mono samples, voiced


class TurnAudio:
    def __init__(self, vad: VadConfig) -> None:
        self.frame_ms = vad.frame_ms
        self._recent: deque[Frame] = deque(maxlen=self._recent_frames(vad))
        self._pending: list[Frame] = []
        self._turn: list[Frame] = []

    @staticmethod
    def _recent_frames(vad: VadConfig) -> int:
        # the onset is found up to start_window_ms after it happened; padding goes before that
        return (vad.prefix_padding_ms + vad.start_window_ms) // vad.frame_ms + 1

    def reconfigure(self, vad: VadConfig) -> None:
        self.frame_ms = vad.frame_ms
        self._recent = deque(self._recent, maxlen=self._recent_frames(vad))

    def hear(self, frame: np.ndarray, voiced: bool) -> None:
        """Every frame of the call, turn or not."""
        self._recent.append((frame, voiced))

    def open(self, frames: int) -> None:
        """A turn starts with the last ``frames`` frames heard (its prefix and its speech so far)."""
        self._turn = list(self._recent)[-max(1, frames):]
        self._pending = list(self._turn)

    def add(self, frame: np.ndarray, voiced: bool, feed: bool) -> None:
        """A frame of the open turn; ``feed`` False while the turn's input is closed (it is kept
        in the turn in case the caller resumes)."""
        self._turn.append((frame, voiced))
        if feed:
            self._pending.append((frame, voiced))

    @property
    def pending_ms(self) -> int:
        return len(self._pending) * self.frame_ms

    def take_pending(self) -> CallerAudio:
        frames, self._pending = self._pending, []
        return self._caller_audio(frames)

    def replay(self) -> CallerAudio:
        """The whole turn so far; nothing is pending after it."""
        self._pending = []
        return self._caller_audio(self._turn)

    def frames(self) -> list[Frame]:
        """The whole turn so far, frame by frame (nothing pending changes)."""
        return list(self._turn)

    def turn_samples(self) -> np.ndarray:
        """The whole turn so far, float32 (nothing pending changes)."""
        return self._caller_audio(self._turn).samples

    def close(self) -> None:
        self._pending, self._turn = [], []

    def empty(self) -> CallerAudio:
        return self._caller_audio([])

    def _caller_audio(self, frames: list[Frame]) -> CallerAudio:
        if not frames:
            return CallerAudio(np.zeros(0, np.float32), [], self.frame_ms)
        samples = np.concatenate([frame for frame, _ in frames]).astype(np.float32) / 32768.0
        return CallerAudio(samples, [voiced for _, voiced in frames], self.frame_ms)

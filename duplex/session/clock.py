"""Input stream time -> monotonic time, robust to network jitter and to gaps in the stream."""

from __future__ import annotations

import numpy as np

from duplex.runtime.contract import SESSION_RATE

_GAP_S = 0.1  # arriving this much later than the stream clock predicts means samples were skipped


class InputClock:
    """Maps sample counts of the caller's audio to the monotonic time they were captured,
    up to a constant: ``anchor + count / rate``, where the anchor follows the least-delayed
    arrival (jitter only ever delays). A stream that stopped and resumed (DTX, packet loss)
    arrives late by more than jitter allows, and the anchor moves forward to it."""

    def __init__(self, rate: int = SESSION_RATE) -> None:
        self.rate = rate
        self.samples = 0
        self._anchor: float | None = None

    def advance(self, count: int, arrival: float) -> float:
        """``count`` new samples arrived at ``arrival``; returns the time just after the last."""
        self.samples += count
        candidate = arrival - self.samples / self.rate
        if self._anchor is None or candidate < self._anchor or candidate > self._anchor + _GAP_S:
            self._anchor = candidate
        return self._anchor + self.samples / self.rate

    def time_at(self, stream_ms: float) -> float:
        """Monotonic time of a point in the stream (ms since its first sample)."""
        return (self._anchor or 0.0) + stream_ms / 1000.0


class InputFrames:
    """Caller audio of any length -> whole frames, each with the time its last sample was
    captured (on the monotonic clock, through ``InputClock``). A partial frame waits for more."""

    def __init__(self) -> None:
        self.clock = InputClock()
        self._pending = np.zeros(0, np.int16)

    def push(self, samples: np.ndarray, arrival: float, frame_len: int) -> list[tuple[np.ndarray, float]]:
        end_time = self.clock.advance(len(samples), arrival)
        audio = np.concatenate([self._pending, samples.astype(np.int16, copy=False)])
        whole = len(audio) - len(audio) % frame_len
        self._pending = audio[whole:]
        rate = self.clock.rate
        last_end = end_time - len(self._pending) / rate  # just after the last whole frame
        return [(audio[start:start + frame_len], last_end - (whole - start - frame_len) / rate)
                for start in range(0, whole, frame_len)]

"""The agent's voice from a loudspeaker back into the microphone, as on a phone on speaker with
no echo cancellation.

A device plays what it receives on its sound card's steady clock, behind a jitter buffer of
fixed depth, and the microphone picks the played sound up after a short acoustic delay. So the
echo path's delay is fixed. A frame that arrives after its turn to play is lost (concealed as
silence); only a stream that has fallen far or lastingly behind (its sender stalled and skipped
ahead) is played later from then on. Mixing received frames into the
microphone in the order they happen to be handled would instead tie the delay to how the test
process is scheduled, which no device does.
"""

from __future__ import annotations

from collections import deque

import numpy as np

RATE = 48000
FRAME = 960  # 20 ms
_RESTART_AFTER_LATE = 5  # this many late frames in a row: the sender fell behind for good


class EchoPath:
    def __init__(self, gain: float, buffer_s: float = 0.06, acoustic_s: float = 0.01,
                 restart_late_s: float = 0.3) -> None:
        self.gain = gain
        self._buffer_s = buffer_s
        self._acoustic_s = acoustic_s
        self._restart_late_s = restart_late_s
        self._origin: float | None = None  # monotonic time at which stream position 0 plays
        self._played: deque[tuple[float, np.ndarray]] = deque()  # (play time, float32 mono 48 kHz)
        self.lost = 0  # frames that came after their turn
        self.restarts = 0  # times the stream fell so far behind that playback moved later
        self._late_in_a_row = 0

    def received(self, pcm: np.ndarray, pts: int | None, arrival: float) -> None:
        """A frame of the agent's audio (float32 mono 48 kHz) at stream position ``pts``
        (48 kHz samples), handled at ``arrival`` (monotonic)."""
        if self.gain <= 0 or pts is None:
            return
        if self._origin is None:
            self._origin = arrival + self._buffer_s - pts / RATE
        play_at = self._origin + pts / RATE
        if play_at < arrival:
            self._late_in_a_row += 1
            if play_at >= arrival - self._restart_late_s and self._late_in_a_row < _RESTART_AFTER_LATE:
                self.lost += 1
                return
            self.restarts += 1
            self._origin += arrival + self._buffer_s - play_at
            play_at = arrival + self._buffer_s
        self._late_in_a_row = 0
        self._played.append((play_at, pcm))

    def echo(self, start: float, samples: int) -> np.ndarray:
        """What the microphone picks up of the played audio over ``samples`` from ``start``."""
        out = np.zeros(samples, np.float32)
        heard_from = start - self._acoustic_s
        while self._played and self._played[0][0] + len(self._played[0][1]) / RATE < heard_from - 1.0:
            self._played.popleft()  # long played and long heard
        for play_at, pcm in self._played:
            offset = round((play_at - heard_from) * RATE)
            lo, hi = max(offset, 0), min(offset + len(pcm), samples)
            if lo < hi:
                out[lo:hi] += pcm[lo - offset:hi - offset]
        return self.gain * out

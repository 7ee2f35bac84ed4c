"""Input stream time -> monotonic time, robust to network jitter, to stalls of our own event
loop and to gaps in the stream."""

from __future__ import annotations

from collections import deque

import numpy as np

from duplex.audio import SESSION_RATE

_GAP_S = 0.1  # arriving this much later than the stream clock predicts means samples were skipped
SETTLE_S = 1.0  # with stream positions: lateness must last this long to move the clock forward
MAX_HOLE_S = 1.0  # a longer hole in the stream is not filled: the clock starts over after it
_SLACK_S = 0.005  # positions this close to the count are the same place (resampler rounding)


class InputClock:
    """Maps sample positions of the caller's audio to the monotonic time they were captured,
    up to a constant: ``anchor + position / rate``, where the anchor follows the least-delayed
    arrival (jitter only ever delays).

    Where the transport says where each chunk belongs in the stream (RTP timestamps), a gap
    (DTX, packet loss) is a jump in position, and lateness alone means only that the chunk
    waited: behind a stall of our event loop, say, whose backlog then arrives in a burst. The
    anchor moves forward only when no arrival of the last ``SETTLE_S`` was within jitter of it
    (the sender's own clock jumped). Without positions, lateness is the
    only sign of a gap, and the anchor moves forward to the first chunk that late."""

    def __init__(self, rate: int = SESSION_RATE) -> None:
        self.rate = rate
        self.samples = 0  # the stream position just after the newest sample
        self._anchor: float | None = None
        self._start: int | None = None  # the first chunk's position, when positions are given
        self._recent: deque[tuple[float, float]] = deque()  # (arrival, candidate), candidates rising

    def advance(self, count: int, arrival: float, position: int | None = None) -> float:
        """``count`` new samples arrived at ``arrival``; ``position`` (if known) is where the
        first of them belongs in the stream, in samples at ``rate`` from any origin. Returns the
        time just after the last."""
        if position is not None:
            self._skip_to(position)
        self.samples += count
        candidate = arrival - self.samples / self.rate
        if self._anchor is None or candidate < self._anchor:
            self._anchor = candidate
        elif position is None:
            if candidate > self._anchor + _GAP_S:
                self._anchor = candidate
        else:
            settled = self._settled_lateness(arrival, candidate)
            if settled > self._anchor + _GAP_S:
                self._anchor = settled
        return self._anchor + self.samples / self.rate

    def time_at(self, stream_ms: float) -> float:
        """Monotonic time of a point in the stream (ms since its first sample)."""
        return (self._anchor or 0.0) + stream_ms / 1000.0

    def _skip_to(self, position: int) -> None:
        if self._start is None:
            self._start = position - self.samples
        ahead = position - self._start - self.samples
        if abs(ahead) <= _SLACK_S * self.rate:
            return
        if 0 < ahead <= MAX_HOLE_S * self.rate:
            self.samples += ahead  # samples that never came
            return
        self._start = position - self.samples  # a long hole, a repeat, a restarted sender: count from here
        if ahead > 0:
            self._anchor = None
            self._recent.clear()

    def _settled_lateness(self, arrival: float, candidate: float) -> float:
        """The least-delayed candidate of the last SETTLE_S (a sliding minimum); -inf until the
        window is full."""
        while self._recent and self._recent[-1][1] >= candidate:
            self._recent.pop()
        self._recent.append((arrival, candidate))
        full = self._recent[0][0] <= arrival - SETTLE_S
        while self._recent[0][0] < arrival - SETTLE_S:
            self._recent.popleft()
        return self._recent[0][1] if full else float("-inf")


class InputFrames:
    """Caller audio of any length -> whole frames, each with the time its last sample was
    captured (on the monotonic clock, through ``InputClock``). A partial frame waits for more."""

    def __init__(self) -> None:
        self.clock = InputClock()
        self._pending = np.zeros(0, np.int16)

    def push(self, samples: np.ndarray, arrival: float, frame_len: int,
             position: int | None = None) -> list[tuple[np.ndarray, float]]:
        before = self.clock.samples
        end_time = self.clock.advance(len(samples), arrival, position)
        skipped = self.clock.samples - before - len(samples)
        if skipped > 0:  # the stream has a hole here: it is heard as the silence it was
            samples = np.concatenate([np.zeros(skipped, np.int16), samples.astype(np.int16, copy=False)])
        audio = np.concatenate([self._pending, samples.astype(np.int16, copy=False)])
        whole = len(audio) - len(audio) % frame_len
        self._pending = audio[whole:]
        rate = self.clock.rate
        last_end = end_time - len(self._pending) / rate  # just after the last whole frame
        return [(audio[start:start + frame_len], last_end - (whole - start - frame_len) / rate)
                for start in range(0, whole, frame_len)]

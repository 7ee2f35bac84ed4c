"""A small fixed-delay jitter buffer for one RTP stream of fixed-size frames.

Packets are filed by sequence number; playout pops one frame per tick in sequence order,
starting once ``depth`` frames are queued. The playout delay then stays fixed: a frame missing
at its tick plays as ``None`` (the caller fills silence) and arrives too late to be used, so
jitter costs a lost frame instead of a delay that grows with every hiccup (which would also
keep moving the echo path the session's echo gate tracks). Only when the stream has stopped
(silence suppression, hold) does playout wait for ``depth`` frames again. Duplicates are
dropped, and a large sequence jump (a restarted sender) resynchronises the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RESYNC_GAP = 100  # sequence jump (either way) treated as a new stream, not as loss or lateness
STOPPED_AFTER = 10  # this many frames missing in a row (200 ms): the sender stopped; re-prime


def _seq_diff(a: int, b: int) -> int:
    """Signed distance a - b in 16-bit sequence space."""
    return ((a - b + 0x8000) & 0xFFFF) - 0x8000


@dataclass
class JitterStats:
    received: int = 0
    played: int = 0
    lost: int = 0
    late: int = 0
    duplicate: int = 0
    overflow: int = 0
    resyncs: int = 0
    underruns: int = 0


@dataclass
class JitterBuffer:
    depth: int = 3  # frames held before playout starts (3 x 20 ms = 60 ms)
    capacity: int = 50
    stats: JitterStats = field(default_factory=JitterStats)
    _frames: dict[int, bytes] = field(default_factory=dict)
    _next: int | None = None  # sequence number the next pop plays
    _primed: bool = False
    _missing_run: int = 0

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, sequence: int, payload: bytes) -> None:
        self.stats.received += 1
        if self._next is None or (not self._primed and not self._frames):
            self._next = sequence  # a stream (re)starts: playout begins at its first packet
        ahead = _seq_diff(sequence, self._next)
        if abs(ahead) >= RESYNC_GAP:
            self._resync(sequence)
            ahead = 0
        if ahead < 0 and not self._primed:  # reordered while priming: start earlier
            self._next, ahead = sequence, 0
        if ahead < 0:
            self.stats.late += 1
            return
        if sequence in self._frames:
            self.stats.duplicate += 1
            return
        if ahead >= self.capacity:
            # the sender is far ahead of playout: skip forward rather than grow without bound
            self.stats.overflow += 1
            self._skip_to(sequence - self.capacity + 1)
        self._frames[sequence] = payload
        if len(self._frames) >= self.depth:
            self._primed = True

    def pop(self) -> bytes | None:
        """The frame due now, or None (not primed yet, or lost)."""
        if not self._primed or self._next is None:
            return None
        frame = self._frames.pop(self._next, None)
        self._next = (self._next + 1) & 0xFFFF
        if frame is not None:
            self.stats.played += 1
            self._missing_run = 0
            return frame
        self.stats.lost += 1
        self._missing_run += 1
        if not self._frames:
            self.stats.underruns += self._missing_run == 1
            if self._missing_run >= STOPPED_AFTER:
                self._primed = False  # the stream stopped: start again with `depth` frames
        return None

    def _resync(self, sequence: int) -> None:
        self.stats.resyncs += 1
        self._frames.clear()
        self._next = sequence
        self._primed = False
        self._missing_run = 0

    def _skip_to(self, sequence: int) -> None:
        sequence &= 0xFFFF
        for seq in [s for s in self._frames if _seq_diff(s, sequence) < 0]:
            del self._frames[seq]
        self._next = sequence

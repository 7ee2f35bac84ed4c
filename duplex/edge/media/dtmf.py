"""Keypad digits out as RFC 4733 telephone-events on a call's RTP stream.

One packet per 20 ms tick, in place of that tick's audio, in the stream's own SSRC and sequence
(RFC 4733 §2.5): an event's packets all carry the RTP timestamp of its first tick (held), the
first one with the marker bit, each one the duration so far; the last is the end packet, sent
three times (§2.5.1.4) on the following ticks, with the same timestamp and duration. A gap of
audio then separates two digits so the far end's detector sees each one (ITU-T Q.24's minimum
pause is 40 ms).
"""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass

from duplex.edge.media.rtp import DTMF_EVENTS

TONE_TICKS = 5  # 100 ms of tone: what PSTN gateways send (Q.24: at least 40 ms)
END_REPEATS = 3  # the end packet, sent this many times (RFC 4733 §2.5.1.4)
GAP_TICKS = 3  # 60 ms of audio between two digits
VOLUME = 10  # -10 dBm0, the power RFC 4733 examples use
MAX_QUEUED = 64  # digits waiting to be sent; more is refused


class DtmfQueueFull(ValueError):
    """More digits than the sender holds; nothing of the request was queued."""


@dataclass(frozen=True)
class EventPacket:
    payload: bytes
    timestamp: int  # the event's first tick (held for all its packets)
    marker: bool


class DtmfSender:
    """Digits waiting to go, and the one being sent; ``next`` once per tick."""

    def __init__(self, samples_per_tick: int, max_queued: int = MAX_QUEUED) -> None:
        self._samples = samples_per_tick
        self._max = max_queued
        self._queue: collections.deque[str] = collections.deque()
        self._digit: str | None = None
        self._tick = 0  # ticks of the current digit so far
        self._start = 0  # its RTP timestamp
        self.sent: collections.deque[str] = collections.deque(maxlen=64)  # the last digits sent (stats, tests)

    def queue(self, digits: str) -> None:
        if len(self._queue) + len(digits) > self._max:
            raise DtmfQueueFull(f"{len(self._queue)} digits are still waiting to be sent; {len(digits)} more "
                                f"would pass the limit of {self._max}")
        self._queue.extend(digits)

    @property
    def busy(self) -> bool:
        return self._digit is not None or bool(self._queue)

    def next(self, timestamp: int) -> EventPacket | None:
        """The event packet to send this tick instead of audio (``timestamp``: the tick's own),
        or None: send audio."""
        if self._digit is None:
            if not self._queue:
                return None
            self._digit, self._tick, self._start = self._queue.popleft(), 0, timestamp
        tick, self._tick = self._tick, self._tick + 1
        last_end = TONE_TICKS - 1 + END_REPEATS - 1
        if tick > last_end:  # the gap after the digit: audio
            if tick >= last_end + GAP_TICKS:
                self._digit = None
            return None
        end = tick >= TONE_TICKS - 1
        duration = self._samples * (min(tick, TONE_TICKS - 1) + 1)
        payload = struct.pack("!BBH", DTMF_EVENTS.index(self._digit), (0x80 if end else 0) | VOLUME, duration)
        if tick == last_end:
            self.sent.append(self._digit)
        return EventPacket(payload, self._start, marker=tick == 0)

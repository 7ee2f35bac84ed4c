"""No amplification over UDP: a source is never sent more bytes than it sent us.

Each source address has a credit: a small allowance (enough to answer one OPTIONS ping or
one INVITE in full), plus the bytes it sent us, minus the bytes we sent it; kept while the
source keeps sending, forfeited (back to the allowance) after a window of silence. A send
that does not fit the credit is dropped, and counted. A spoofed flood therefore gets back at
most what it sent plus one allowance, retransmissions of our final responses included, since
every one of them is a send.

The table of sources is bounded (least recently heard dropped first); a forgotten source
only loses credit, which errs on the safe side.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Credit:
    bytes: int
    heard: float  # when the source last sent us anything


class ReplyBudget:
    def __init__(self, window_s: float, allowance: int = 0, max_sources: int = 10000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.allowance = allowance
        self.max_sources = max_sources
        self.clock = clock
        self._sources: OrderedDict[str, _Credit] = OrderedDict()
        self.dropped = 0  # sends refused
        self.dropped_bytes = 0

    def received(self, host: str, size: int) -> None:
        now = self.clock()
        credit = self._sources.pop(host, None)
        if credit is None or now - credit.heard > self.window_s:
            credit = _Credit(self.allowance, now)
        credit.bytes += size
        credit.heard = now
        self._sources[host] = credit  # most recently heard last
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)

    def spend(self, host: str, size: int) -> bool:
        """Take ``size`` bytes of ``host``'s credit; False (nothing taken) if it has not that much."""
        credit = self._sources.get(host)
        if credit is not None and self.clock() - credit.heard > self.window_s:
            del self._sources[host]
            credit = None
        if credit is None or credit.bytes < size:
            self.dropped += 1
            self.dropped_bytes += size
            return False
        credit.bytes -= size
        return True

    def available(self, host: str) -> int:
        credit = self._sources.get(host)
        if credit is None or self.clock() - credit.heard > self.window_s:
            return 0
        return credit.bytes

    def stats(self) -> dict[str, int]:
        return {"sources": len(self._sources), "sends_dropped": self.dropped,
                "bytes_dropped": self.dropped_bytes}

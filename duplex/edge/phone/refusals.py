"""Refusals at the phone doors: counted by kind (counts only, never who) and logged at a
bounded rate, so a flood costs a few log lines a minute, not a line per packet."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

LINES_PER_WINDOW = 5  # per kind
WINDOW_S = 60.0


class Refusals:
    def __init__(self, counters: collections.Counter[str], log: logging.Logger, door: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.counters = counters
        self._log = log
        self._door = door
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # kind -> (start, logged, muted)

    def note(self, kind: str, detail: str) -> None:
        """Count one refusal of ``kind``; log it unless this kind has logged enough lately."""
        self.counters[kind] += 1
        now = self._clock()
        start, logged, muted = self._windows.get(kind, (now, 0, 0))
        if now - start >= WINDOW_S:
            if muted:
                self._log.warning("%s %s: %d more not logged in the last %.0f s", self._door,
                                  kind.replace("_", " "), muted, now - start)
            start, logged, muted = now, 0, 0
        if logged < LINES_PER_WINDOW:
            self._log.warning("%s %s (#%d): %s", self._door, kind.replace("_", " "),
                              self.counters[kind], detail)
            logged += 1
        else:
            muted += 1
        self._windows[kind] = (start, logged, muted)

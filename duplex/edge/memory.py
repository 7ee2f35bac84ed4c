"""The memory of a process that holds calls' media (the server, a media worker) between calls.

A call leaves its objects (aiortc's peer connection, transports, codecs, their threads) in
reference cycles, and CPython runs a full collection only when the long-lived heap grew by a
quarter: on a server that imported a few hundred thousand objects at start that is rare, so
ended calls' garbage (and the threads it holds) piles up, and freed memory stays with the
allocator. Here: the objects of start-up are frozen (never scanned again, so a full collection
costs only what the live calls own), and after calls end a full collection runs, then glibc is
asked to hand free pages back to the system."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("duplex.edge")


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


@dataclass
class CollectionStats:
    runs: int = 0
    collected: int = 0  # unreachable objects found, over all runs
    last_pause_ms: float = 0.0
    max_pause_ms: float = 0.0


class MemoryKeeper:
    """Collects ended calls' garbage: at most once per ``interval_s``, when a call ended since
    the last run (``ended`` counts calls closed so far). A collection stops the event loop for
    a time that grows with what the live calls own (~50 ms with 30 live), so while calls are
    live it waits until ``batch_calls`` calls have ended or ``longest_wait_s`` passed."""

    def __init__(self, ended: Callable[[], int], live: Callable[[], int], interval_s: float = 2.0,
                 batch_calls: int = 8, longest_wait_s: float = 60.0) -> None:
        self._ended = ended
        self._live = live
        self._interval_s = interval_s
        self._batch_calls = batch_calls
        self._longest_wait_s = longest_wait_s
        self._seen = ended()
        self._first_unseen_at: float | None = None  # when a call ended that no collection has followed yet
        self._trim = _malloc_trim()
        self._task: asyncio.Task | None = None
        self._frozen = 0
        self.stats = CollectionStats()

    def start(self) -> None:
        """Freeze what start-up made (call once the models and stages are up), then watch."""
        gc.collect()
        gc.freeze()
        self._frozen = gc.get_freeze_count()  # counting walks every frozen object: once, here
        self._task = asyncio.create_task(self._watch())

    def stats_view(self) -> dict:
        stats = self.stats
        return {"collections": stats.runs, "collected_objects": stats.collected,
                "last_pause_ms": round(stats.last_pause_ms, 2), "max_pause_ms": round(stats.max_pause_ms, 2),
                "frozen_objects": self._frozen, "calls_seen": self._seen}

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def collect_if_calls_ended(self) -> bool:
        """One full collection (and trim) if calls ended since the last and it is time; True if it ran."""
        ended = self._ended()
        if ended == self._seen:
            return False
        now = time.monotonic()
        if self._first_unseen_at is None:
            self._first_unseen_at = now
        due = (not self._live() or ended - self._seen >= self._batch_calls
               or now - self._first_unseen_at >= self._longest_wait_s)
        if not due:
            return False
        self._seen, self._first_unseen_at = ended, None
        started = time.perf_counter()
        found = gc.collect()
        if self._trim is not None:
            self._trim()
        pause_ms = (time.perf_counter() - started) * 1000
        stats = self.stats
        stats.runs += 1
        stats.collected += found
        stats.last_pause_ms = pause_ms
        stats.max_pause_ms = max(stats.max_pause_ms, pause_ms)
        log.debug("collected %d objects of ended calls in %.1f ms", found, pause_ms)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.collect_if_calls_ended()

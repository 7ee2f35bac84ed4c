"""A frame clock on the monotonic clock: one deadline every ``frame_s``, never drifting.

Every door's agent audio goes out through it: ``FramePacer.run`` is the output loop of the doors
that push frames (the Realtime WebSocket, SIP, Twilio, the WebRTC media workers, a door of your
own); a door whose library pulls frames (aiortc's ``recv``) asks ``wait_next`` for each one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Tick = Callable[[float], Awaitable[bool | None]]  # a frame's work at its due time; True ends the loop


class FramePacer:
    """Deadlines are ``anchor + n * frame_s``, so sleeping late never accumulates drift. If the
    loop falls more than ``max_lag_s`` behind (a stall), the anchor moves forward instead of
    sending a burst of catch-up frames; the caller's timestamps stay continuous either way."""

    def __init__(self, frame_s: float = 0.02, max_lag_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.frame_s = frame_s
        self.max_lag_s = max_lag_s
        self._clock = clock
        self._sleep = sleep  # with ``clock``, a test's own time
        self._anchor: float | None = None
        self._count = 0
        self.reanchors = 0
        self.frames = 0  # deadlines given so far (the count within the anchor restarts at a re-anchor)

    async def wait_next(self) -> float:
        """Sleep until the next frame is due; returns its due time (clock seconds)."""
        now = self._clock()
        if self._anchor is None:
            self._anchor = now
        due = self._anchor + self._count * self.frame_s
        if now - due > self.max_lag_s:
            self._anchor, self._count, due = now, 0, now
            self.reanchors += 1
        elif due > now:
            await self._sleep(due - now)
        self._count += 1
        self.frames += 1
        return due

    async def run(self, tick: Tick) -> None:
        """``tick(due)`` once per frame, each at its due time, until it returns True (or the
        task is cancelled: a door stops its output by cancelling the task that runs this)."""
        while not await tick(await self.wait_next()):
            pass

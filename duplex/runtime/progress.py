"""Progress reports (a stage admitted or released a request), held back a moment and sent together.

A report sent at once wakes the coordinator in the middle of the hop that caused it, and on a
small box the coordinator then competes for a core with the very stages moving the data. The
coordinator only needs them to set a request's status and, when a stage dies, to know which
requests it had already passed on (a stage that dies within ``HOLD_S`` of passing a request on
fails it too); neither needs them within milliseconds. Holding them ``HOLD_S`` sends one burst
per busy stretch instead of two messages per hop, so a burst rarely lands in a hop either.

The I/O loop owns the buffer: it polls ``wake_fd`` (calling ``on_wake`` when it is readable),
asks ``poll_timeout_ms`` how long it may sleep, and calls ``flush_due`` after each wake-up.
``add`` may be called from any thread under the host's lock. The first report of a burst wakes
the loop only if the loop is asleep (it may be for long, and must learn the deadline); a loop
that is awake asks ``poll_timeout_ms`` before it sleeps again. That is a question of the loop's
state, not of which thread is asking: ``poll_timeout_ms`` marks the loop asleep before it reads
the deadline, ``awake`` after the poll returns, and ``add`` sets the deadline before it looks, so
a report is never left waiting past its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from duplex.runtime.messages import Progress, ProgressReports
from duplex.runtime.wakeup import WakePipe

HOLD_S = 0.02  # how long a report may wait for company


class ProgressBuffer:
    def __init__(self, send: Callable[[ProgressReports], None], hold_s: float = HOLD_S) -> None:
        self._send = send
        self._hold_s = hold_s
        self._items: list[Progress] = []
        self._due: float | None = None
        self._wake = WakePipe()
        self.wake_fd = self._wake.fd
        self._loop_asleep = False

    def add(self, report: Progress) -> None:
        self._items.append(report)
        if self._due is not None:
            return
        self._due = time.monotonic() + self._hold_s
        if self._loop_asleep:
            self._wake.wake()

    def poll_timeout_ms(self, idle_ms: int) -> int:
        """How long the loop may sleep; the loop is asleep from here until ``awake``."""
        self._loop_asleep = True
        if self._due is None:
            return idle_ms
        return max(0, min(idle_ms, int((self._due - time.monotonic()) * 1000) + 1))

    def awake(self) -> None:
        """The loop's poll returned: reports added from now on are seen before it sleeps again."""
        self._loop_asleep = False

    def flush_due(self) -> None:
        """Send everything once the oldest report has waited long enough."""
        if self._due is not None and time.monotonic() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Send everything now (before a stats reply, so the coordinator's books are current)."""
        if not self._items:
            return
        items, self._items, self._due = self._items, [], None
        self._send(ProgressReports(reports=items))

    def pending(self, stage: str) -> int:
        return sum(report.stage == stage for report in self._items)

    def on_wake(self) -> None:
        """A burst began: empty the pipe (the loop now knows the deadline)."""
        self._wake.clear()

    def close(self) -> None:
        self._wake.close()

"""The server's ``Admission`` (``duplex.session.manager``): a new call is refused while a stage
is down (it could not be served) or when taking it would push turn latency past the budget
(``AdmissionConfig``). Reads only state kept up to date in the background (the supervisor's
process states, ``LoadMonitor.snapshot``): answering takes microseconds and awaits nothing."""

from __future__ import annotations

import math
from collections.abc import Callable

from duplex.config.pipeline import AdmissionConfig
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.load import LoadMonitor
from duplex.session.manager import Refused
from duplex.session.observe import Refusal


class LoadAdmission:
    def __init__(self, coordinator: Coordinator, monitor: LoadMonitor | None, config: AdmissionConfig,
                 media_lag_s: Callable[[], float] | None = None) -> None:
        self.coordinator = coordinator
        self.monitor = monitor  # None: only a stage that is down refuses
        self.config = config
        self.media_lag_s = media_lag_s  # the worst media worker loop's lateness (edge.media_workers)
        self.refusals = {Refusal.OVERLOADED: 0, Refusal.STAGE_DOWN: 0}

    def refusal(self, live: int) -> Refused | None:
        refused = self._stage_down() or (self._overloaded() if live else None)
        if refused is not None:
            self.refusals[refused.reason] += 1
        return refused

    def _stage_down(self) -> Refused | None:
        supervisor = self.coordinator.supervisor
        down = supervisor.down_error()
        if down is None:
            return None
        wait = supervisor.retry_after_s() or self.config.retry_after_s
        return Refused(Refusal.STAGE_DOWN, f"the server cannot take calls now: {down.message}", math.ceil(wait))

    def _overloaded(self) -> Refused | None:
        if self.monitor is None or not self.config.enabled:
            return None
        lag_s = self.monitor.loop_lag_s
        media_s = self.media_lag_s() if self.media_lag_s is not None else 0.0
        if max(lag_s, media_s) * 1000 > self.config.max_loop_lag_ms:
            which = "its event loop" if lag_s >= media_s else "a media worker's event loop"
            return Refused(Refusal.OVERLOADED, f"the server is overloaded ({which} runs "
                                               f"{max(lag_s, media_s) * 1000:.0f} ms late; limit "
                                               f"{self.config.max_loop_lag_ms:g} ms); try again later",
                           self.config.retry_after_s)
        snapshot = self.monitor.snapshot
        wait_s = lag_s + sum(stage.wait_s for stage in snapshot.stages.values())
        if wait_s * 1000 > self.config.turn_budget_ms:
            busiest = max(snapshot.stages.items(), key=lambda item: item[1].wait_s)[0] if snapshot.stages else "?"
            return Refused(Refusal.OVERLOADED, f"the server is overloaded (a new turn would wait about "
                                               f"{wait_s * 1000:.0f} ms, most at stage {busiest}; budget "
                                               f"{self.config.turn_budget_ms:g} ms); try again later",
                           self.config.retry_after_s)
        return None

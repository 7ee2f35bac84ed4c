"""The server's watch on itself: metrics, structured call logs and call recordings behind the
session's one ``CallObserver`` seam, readiness for load balancers, and the SIGTERM drain.

Each is switched on its own (``WatchConfig``); with everything off the sessions get no observer
at all (``--no-metrics`` without ``--record`` or ``--call-log``): their tap is a no-op."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from duplex.edge.http.health import Readiness
from duplex.runtime.coordinator import Coordinator
from duplex.server import call_log
from duplex.server.metrics import ServerMetrics
from duplex.server.recording import Recorder
from duplex.server.recording_policy import DEFAULT_NOTICE, RecordingDesk, RecordingPolicy
from duplex.session.manager import SessionManager
from duplex.session.observe import CallTap, CallWatch, Refusal
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.recording import NOT_RECORDED, Opening, RecordingSwitch

log = logging.getLogger("duplex.server")


class WatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metrics: bool = True  # GET /metrics and the per-call instruments behind it
    call_log: str | None = None  # a file for the JSON call-event lines (else only with --log-level info)
    record_dir: Path | None = None  # recordings are kept here (none made when None)
    # which calls: None means all with a record_dir (what --record DIR always meant), else none
    record_policy: RecordingPolicy | None = None
    record_share: float | None = Field(None, ge=0, le=1)  # policy share: this fraction of calls
    record_notice: str = Field(DEFAULT_NOTICE, min_length=1, max_length=500)  # said first on a recorded phone call
    record_max_mb: float = Field(1024.0, gt=0)  # the recordings folder is kept under this ...
    record_max_age_h: float = Field(24.0, gt=0)  # ... and nothing older than this
    drain_timeout_s: float = Field(30.0, ge=0)  # SIGTERM: live calls get this long to finish

    @model_validator(mode="after")
    def _check(self) -> WatchConfig:
        policy = self.policy
        if policy is not RecordingPolicy.NONE and self.record_dir is None:
            raise ValueError(f"--record-policy {policy.value} needs --record DIR (where the recordings go)")
        if policy is RecordingPolicy.SHARE and self.record_share is None:
            raise ValueError("--record-policy share needs --record-share F (the fraction of calls, 0..1)")
        if self.record_share is not None and policy is not RecordingPolicy.SHARE:
            raise ValueError(f"--record-share applies to --record-policy share, not {policy.value}")
        return self

    @property
    def policy(self) -> RecordingPolicy:
        """The policy in force: as given; else share with --record-share, all with --record DIR, none."""
        if self.record_policy is not None:
            return self.record_policy
        if self.record_share is not None:
            return RecordingPolicy.SHARE
        return RecordingPolicy.ALL if self.record_dir is not None else RecordingPolicy.NONE


class _Taps:
    """Several taps as one."""

    def __init__(self, taps: list[CallTap]) -> None:
        self._taps = taps

    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        for tap in self._taps:
            tap.event(event, request_id)

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        for tap in self._taps:
            tap.caller_audio(samples, arrival)

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        for tap in self._taps:
            tap.agent_frame(pcm, due, late_s, starved)

    def close(self) -> None:
        for tap in self._taps:
            try:
                tap.close()
            except OSError as exc:  # a full disk ends a recording, never the call's hang-up
                log.error("closing a call's tap: %s", exc)


class ServerWatch:
    def __init__(self, config: WatchConfig, coordinator: Coordinator, sessions: SessionManager,
                 log_level: str = "warning", auth_counters: Callable[[], dict[str, int]] | None = None) -> None:
        self.config = config
        self.coordinator = coordinator
        self.sessions = sessions
        self.metrics_ = ServerMetrics(coordinator, sessions, auth_counters) if config.metrics else None
        self.recorder = (Recorder(config.record_dir, int(config.record_max_mb * 2**20), config.record_max_age_h * 3600)
                         if config.record_dir is not None else None)  # also the recordings API's store
        self.desk = (RecordingDesk(self.recorder, config.policy, config.record_share or 0.0, config.record_notice)
                     if self.recorder is not None and config.policy is not RecordingPolicy.NONE else None)
        call_log.configure(config.call_log, log_level)
        self._logging = call_log.log.isEnabledFor(logging.INFO)

    @property
    def observes(self) -> bool:
        """Whether sessions need a tap at all."""
        return self.metrics_ is not None or self.desk is not None or self._logging

    # -- the sessions' observer -----------------------------------------------------------------
    def open_call(self, session_id: str, door: str, call_id: str, output_format: OutputFormat,
                  opening: Opening) -> CallWatch:
        taps: list[CallTap] = []
        if self.metrics_ is not None:
            taps.append(self.metrics_.tap(door, output_format))
        if self._logging:
            taps.append(call_log.CallLogTap(session_id, door, call_id))
        recording: RecordingSwitch = NOT_RECORDED
        if self.desk is not None:
            recorder = self.desk.open_call(call_id, output_format, opening.owner)
            taps.append(recorder)
            recording = recorder
        return CallWatch(taps[0] if len(taps) == 1 else _Taps(taps), recording)

    def refused(self, door: str, reason: Refusal) -> None:
        if self.metrics_ is not None:
            self.metrics_.refused(door, reason)
        if self._logging:
            call_log.refused(door, reason.value)

    # -- the edge's health routes ---------------------------------------------------------------
    def metrics_enabled(self) -> bool:
        return self.metrics_ is not None

    async def metrics(self) -> bytes:
        assert self.metrics_ is not None
        return await self.metrics_.render()

    async def readiness(self) -> Readiness:
        sessions, procs = self.sessions, self.coordinator.procs
        live = sessions.live()
        reasons = []
        if sessions.draining:
            reasons.append("draining")
        states = {stage: state.value for stage, state in self.coordinator.supervisor.stage_states().items()}
        down = self.coordinator.supervisor.down_error()
        if down is not None:
            reasons.append(down.message)
        elif not self.coordinator.started or procs.dead() or any(state != "up" for state in states.values()):
            reasons.append("stages not ready")
        if live >= sessions.max_sessions:
            reasons.append("no session slot free")
        return Readiness(ready=not reasons, load=round(live / sessions.max_sessions, 3), sessions=live,
                         max_sessions=sessions.max_sessions, draining=sessions.draining, reasons=reasons,
                         stages=states)

    # -- SIGTERM --------------------------------------------------------------------------------
    async def drain(self) -> bool:
        """Refuse new calls from now on and wait for the live ones to end, up to the deadline;
        True if they all ended in time."""
        self.sessions.draining = True
        print(f"duplex: draining: {self.sessions.live()} live call(s), new calls refused; up to "
              f"{self.config.drain_timeout_s:.0f} s", flush=True)
        await self.sessions.wait_empty(self.config.drain_timeout_s)
        left = self.sessions.live()
        if left:
            print(f"duplex: drain deadline passed; {left} call(s) cut off", flush=True)
        return left == 0

"""Prometheus metrics of one server (``prometheus-client``, a registry of its own).

Two sources, one exposition:
- the calls, as they happen: each call's tap (``MetricsTap``) turns the session's ``duplex.metrics``
  events into turn histograms (time to first audio and each part of it, barge-in stop), counts
  late and starved output frames, calls by door and calls refused and why;
- the stages, when scraped: ``refresh`` asks the coordinator for the same stats ``/duplex/stats``
  shows (one query to every stage) and ``StageCollector`` exports them: live requests, queue
  depth, KV slots and relay blocks in use, step-time histograms, audio made and real-time factor,
  restarts.

Names follow the Prometheus conventions: ``duplex_`` prefix, base units (seconds), ``_total``
counters.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from duplex.runtime.coordinator import Coordinator, StageStatsView
from duplex.runtime.step_stats import STEP_BUCKETS_S
from duplex.runtime.supervisor import ProcessState
from duplex.server.admission import LoadAdmission
from duplex.session.manager import SessionManager
from duplex.session.observe import Refusal
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.turn_timing import PARTS

TURN_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
OVERLAP_KINDS = typing.get_args(typing.get_type_hints(ev.OverlapJudged)["kind"])
BARGE_IN_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class CallMetrics:
    """The per-call instruments (observed by the taps)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.first_audio = Histogram("duplex_turn_first_audio_seconds",
                                     "End of the caller's speech -> first agent frame handed to the transport",
                                     ["door"], buckets=TURN_BUCKETS_S, registry=registry)
        self.parts = Histogram("duplex_turn_part_seconds",
                               "Each part of a turn's time to first audio (they add up to it)",
                               ["door", "part"], buckets=TURN_BUCKETS_S, registry=registry)
        self.barge_in = Histogram("duplex_barge_in_stop_seconds",
                                  "Caller speech onset over the agent -> agent output flushed",
                                  ["door"], buckets=BARGE_IN_BUCKETS_S, registry=registry)
        self.verdicts = Counter("duplex_overlap_verdicts", "What the caller's sounds over the agent were judged "
                                "(an interruption cut the reply; a backchannel or a noise let it go on)",
                                ["door", "kind"], registry=registry)
        self.calls = Counter("duplex_calls", "Calls (sessions) opened", ["door"], registry=registry)
        self.refused = Counter("duplex_calls_refused", "Calls turned away", ["door", "reason"], registry=registry)
        self.late = Counter("duplex_audio_late_frames",
                            "Output frames handed to the transport more than a frame period after they were due",
                            ["door"], registry=registry)
        self.starved = Counter("duplex_audio_underrun_frames",
                               "Output frames of silence inside a reply: the pipeline had no audio ready",
                               ["door"], registry=registry)
        for reason in Refusal:  # every reason shows, at 0 until it happens
            self.refused.labels("webrtc", reason.value)


class MetricsTap:
    """One call's share of the metrics."""

    def __init__(self, metrics: CallMetrics, door: str, output_format: OutputFormat) -> None:
        self._frame_s = output_format.frame_ms / 1000
        self._first_audio = metrics.first_audio.labels(door)
        self._parts = {part: metrics.parts.labels(door, part) for part in PARTS}
        self._barge_in = metrics.barge_in.labels(door)
        self._late = metrics.late.labels(door)
        self._starved = metrics.starved.labels(door)
        self._verdicts = {kind: metrics.verdicts.labels(door, kind) for kind in OVERLAP_KINDS}
        metrics.calls.labels(door).inc()

    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        if isinstance(event, ev.OverlapJudged):
            self._verdicts[event.kind].inc()
        if not isinstance(event, ev.TurnMetrics):
            return
        if event.barge_in_ms is not None:
            self._barge_in.observe(event.barge_in_ms / 1000)
        if event.ttfa_ms is not None:
            self._first_audio.observe(event.ttfa_ms / 1000)
            for part, child in self._parts.items():
                ms = getattr(event, f"{part}_ms")
                if ms is not None:
                    child.observe(ms / 1000)

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        pass

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        if late_s > self._frame_s:
            self._late.inc()
        if starved:
            self._starved.inc()

    def close(self) -> None:
        pass


class StageCollector(Collector):
    """The stages' stats as of the last ``refresh`` (a scrape refreshes first)."""

    def __init__(self, coordinator: Coordinator, sessions: SessionManager,
                 auth_counters: Callable[[], dict[str, int]] | None = None) -> None:
        self._coordinator = coordinator
        self._sessions = sessions
        self._auth_counters = auth_counters
        self._stages: dict[str, StageStatsView] = {}
        self.reachable = False

    async def refresh(self, timeout: float = 2.0) -> None:
        # a stage down (restarting): the scrape still answers with the others, saying so
        self._stages = await self._coordinator.collect_stats(timeout=timeout)
        self.reachable = len(self._stages) == len(self._coordinator.cfg.stages)

    def collect(self) -> Iterator[Metric]:
        yield from self._stage_gauges()
        yield from self._stage_steps()
        yield from self._runtime()
        yield from self._supervision()
        yield from self._admission()
        yield from self._sessions_now()
        if self._auth_counters is not None:
            refused = CounterMetricFamily("duplex_auth_refused", "Requests refused by the API key check",
                                          labels=["reason"])
            counters = self._auth_counters()
            for reason in ("refused", "rate_limited"):
                refused.add_metric([reason], counters.get(reason, 0))
            yield refused

    def _stage_gauges(self) -> Iterator[Metric]:
        live = GaugeMetricFamily("duplex_stage_live_requests", "Requests a stage holds state for", labels=["stage"])
        queue = GaugeMetricFamily("duplex_stage_queue_depth", "Inputs waiting in a stage (inbox, scheduler queue, "
                                  "buffered out of order)", labels=["stage"])
        kv = GaugeMetricFamily("duplex_stage_kv_slots_in_use", "KV cache slots held (AR stages)", labels=["stage"])
        relay = GaugeMetricFamily("duplex_stage_relay_blocks_in_use", "Shared-memory relay blocks held",
                                  labels=["stage", "direction"])
        held = GaugeMetricFamily("duplex_stage_resource", "Every resource a stage reports, by kind",
                                 labels=["stage", "resource"])
        requests = CounterMetricFamily("duplex_stage_requests", "Requests through a stage, by outcome",
                                       labels=["stage", "outcome"])
        for name, stats in self._stages.items():
            res = stats.resources
            live.add_metric([name], stats.live_requests)
            queue.add_metric([name], res.get("inbox_items", 0) + res.get("queued_items", 0)
                             + res.get("buffered_inputs", 0))
            if "kv_slots" in res:
                kv.add_metric([name], res["kv_slots"])
            relay.add_metric([name, "out"], res.get("relay_blocks_out", 0))
            relay.add_metric([name, "in"], res.get("relay_blocks_in", 0))
            for kind, value in res.items():
                held.add_metric([name, kind], value)
            for outcome, value in stats.counters.items():
                requests.add_metric([name, outcome], value)
        yield from (live, queue, kv, relay, held, requests)

    def _stage_steps(self) -> Iterator[Metric]:
        steps = HistogramMetricFamily("duplex_stage_step_seconds", "Compute time of one scheduler step",
                                      labels=["stage"])
        audio = CounterMetricFamily("duplex_stage_audio_seconds", "Seconds of agent audio a stage made",
                                    labels=["stage"])
        rtf = GaugeMetricFamily("duplex_stage_real_time_factor",
                                "Step compute seconds per second of audio made, since start (below 1: faster than "
                                "real time)", labels=["stage"])
        for name, stats in self._stages.items():
            if stats.steps is None:
                continue
            running, buckets = 0, []
            for bound, count in zip((*STEP_BUCKETS_S, float("inf")), stats.steps.counts):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            steps.add_metric([name], buckets, stats.steps.sum_s)
            if stats.steps.audio_s > 0:
                audio.add_metric([name], stats.steps.audio_s)
                rtf.add_metric([name], stats.steps.sum_s / stats.steps.audio_s)
        yield from (steps, audio, rtf)

    def _runtime(self) -> Iterator[Metric]:
        coordinator = self._coordinator
        restarts = CounterMetricFamily("duplex_stage_restarts", "Restarts of a stage's process after it died",
                                       labels=["stage"])
        for process, stages in coordinator.procs.groups.items():
            for stage in stages:
                restarts.add_metric([stage], coordinator.procs.restarts.get(process, 0))
        finished = CounterMetricFamily("duplex_requests", "Runtime requests ended, by status", labels=["status"])
        for status, value in coordinator.counters.items():
            finished.add_metric([status], value)
        live = GaugeMetricFamily("duplex_requests_live", "Runtime requests in flight")
        live.add_metric([], coordinator.live_requests)
        up = GaugeMetricFamily("duplex_stages_up", "1 if every stage answered the last stats query")
        up.add_metric([], 1 if self.reachable else 0)
        yield from (restarts, finished, live, up)

    def _supervision(self) -> Iterator[Metric]:
        supervisor = self._coordinator.supervisor
        up = GaugeMetricFamily("duplex_stage_up", "1 while a stage's process is up, 0 while it restarts or is down",
                               labels=["stage"])
        state = GaugeMetricFamily("duplex_stage_state", "A stage's supervision state (1 for the current one)",
                                  labels=["stage", "state"])
        window = GaugeMetricFamily("duplex_stage_restarts_in_window",
                                   "Restarts within supervision.restart_window_s (the budget is max_restarts)",
                                   labels=["stage"])
        kills = CounterMetricFamily("duplex_stage_watchdog_kills", "Stage processes killed for not answering pings",
                                    labels=["stage"])
        # a CPU box's overload, stage by stage: how long its process was busy on a CPU or waiting
        # for one while its answer to the watchdog was late (Linux /proc; 0 where unread)
        cpu_wait = CounterMetricFamily("duplex_stage_cpu_wait_seconds", "Seconds a stage's process was busy or "
                                       "waited for a CPU while late answering the watchdog", labels=["stage"])
        for process, stages in self._coordinator.procs.groups.items():
            health = supervisor.health[process]
            for stage in stages:
                up.add_metric([stage], 1 if health.state is ProcessState.UP else 0)
                for kind in ProcessState:
                    state.add_metric([stage, kind.value], 1 if health.state is kind else 0)
                window.add_metric([stage], supervisor.restarts_in_window(process))
                kills.add_metric([stage], health.watchdog_kills)
                cpu_wait.add_metric([stage], health.cpu_wait_s)
        timed_out = CounterMetricFamily("duplex_requests_timed_out",
                                        "Requests failed for making no progress (supervision.request_stall_s)")
        timed_out.add_metric([], supervisor.timed_out)
        yield from (up, state, window, kills, cpu_wait, timed_out)

    def _admission(self) -> Iterator[Metric]:
        admission = self._sessions.admission
        if not isinstance(admission, LoadAdmission):
            return
        refused = CounterMetricFamily("duplex_admission_refusals", "New calls refused by admission, by reason",
                                      labels=["reason"])
        for reason, count in admission.refusals.items():
            refused.add_metric([reason.value], count)
        yield refused
        if admission.monitor is not None:
            lag = GaugeMetricFamily("duplex_event_loop_lag_seconds", "Worst lateness of the event loop's timer "
                                    "in the admission window")
            lag.add_metric([], admission.monitor.loop_lag_s)
            wait = GaugeMetricFamily("duplex_admission_turn_wait_seconds",
                                     "Estimate of a new turn's wait (loop lag + each stage's queued batches and step)")
            wait.add_metric([], admission.monitor.snapshot.turn_wait_s)
            yield from (lag, wait)

    def _sessions_now(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily("duplex_sessions", "Live sessions, by door", labels=["door"])
        doors: dict[str, int] = {}
        for door, _ in self._sessions.sessions.values():
            doors[door] = doors.get(door, 0) + 1
        for door, count in sorted(doors.items()):
            sessions.add_metric([door], count)
        limit = GaugeMetricFamily("duplex_sessions_max", "Session limit (--max-sessions)")
        limit.add_metric([], self._sessions.max_sessions)
        draining = GaugeMetricFamily("duplex_draining", "1 while the server drains (SIGTERM)")
        draining.add_metric([], 1 if self._sessions.draining else 0)
        yield from (sessions, limit, draining)


class ServerMetrics:
    def __init__(self, coordinator: Coordinator, sessions: SessionManager,
                 auth_counters: Callable[[], dict[str, int]] | None = None) -> None:
        disable_created_metrics()  # no ``_created`` series: they double the exposition and nobody graphs them
        self.registry = CollectorRegistry(auto_describe=False)
        self.calls = CallMetrics(self.registry)
        self.stages = StageCollector(coordinator, sessions, auth_counters)
        self.registry.register(self.stages)

    def tap(self, door: str, output_format: OutputFormat) -> MetricsTap:
        return MetricsTap(self.calls, door, output_format)

    def refused(self, door: str, reason: Refusal) -> None:
        self.calls.refused.labels(door, reason.value).inc()

    async def render(self) -> bytes:
        await self.stages.refresh()
        return generate_latest(self.registry)

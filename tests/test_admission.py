"""Admission by load and by the stages' health, at the session manager, over a real coordinator
with real stage processes (toy-voice): a blocked event loop or a deep stage queue makes
``reserve()`` refuse at once (well under 50 ms) with ``ServerOverloaded`` while the live session
goes on, and with no call live nothing refuses by load; with the default thresholds a moderately
loaded server refuses nothing; a stage that is down refuses new calls (``StageDown``, with a
Retry-After) and fails a live session's turn with an ``error`` event at once instead of leaving it
responding."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from duplex.config import load_pipeline
from duplex.config.pipeline import AdmissionConfig
from duplex.config.session import SessionConfig
from duplex.models.registry import BUILDERS
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.load import LoadMonitor
from duplex.server.admission import LoadAdmission
from duplex.server.runtime_adapter import CoordinatorRuntime
from duplex.session.door import SimpleDoor
from duplex.session.manager import ServerOverloaded, SessionManager, StageDown
from duplex.session.observe import Refusal
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.realtime.client_items import ClientTurn
from tests.runtime_helpers import wait_for

pytestmark = pytest.mark.slow

PROBE_S = 0.02
BLOCK_S = 0.3  # how long the test blocks the event loop: 15 probe periods
QUICK_S = 0.05  # a refusal must take less than this


class Server:
    """The toy-voice pipeline behind a session manager, as ``duplex serve`` wires them."""

    def __init__(self, admission: AdmissionConfig, *overrides: str) -> None:
        self.pipeline = load_pipeline("toy-voice", list(overrides))
        self.coordinator = Coordinator(self.pipeline, BUILDERS)
        self.admission_config = admission

    async def __aenter__(self) -> Server:
        await self.coordinator.start()
        self.monitor = LoadMonitor(self.coordinator, self.admission_config)
        self.monitor.start()

        async def sampled() -> bool:  # the monitor's tasks run: the lag timer is armed, the stages sampled
            return self.monitor.snapshot.taken_at > 0

        await wait_for(sampled, timeout=10, what="the first load sample")
        self.admission = LoadAdmission(self.coordinator, self.monitor, self.admission_config)
        self.manager = SessionManager(CoordinatorRuntime(self.coordinator), SessionConfig(), 8, "toy-voice",
                                      admission=self.admission)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.manager.close_all()
            await self.monitor.stop()
        finally:  # the stage processes go whatever failed before
            await self.coordinator.shutdown()

    def open(self) -> tuple[object, list[ev.ServerEvent]]:
        events: list[ev.ServerEvent] = []
        session = self.manager.open(SimpleDoor("websocket", OutputFormat(sample_rate=24000, channels=1), events.append))
        return session, events


async def typed_turn(session, events: list[ev.ServerEvent], text: str = "hello there") -> ev.ServerEvent:
    """Ask by text, for a text reply (it ends with no audio to play out; the voice stage still
    makes its words); the response's end (``response.done``) or the ``error`` that ended it."""
    start = len(events)
    session.request_response(ClientTurn(text=text, output_audio=False))

    async def ended() -> bool:
        return any(isinstance(e, (ev.ResponseDone, ev.ErrorEvent)) for e in events[start:])

    await wait_for(ended, timeout=20, what="the response's end")
    return next(e for e in events[start:] if isinstance(e, (ev.ResponseDone, ev.ErrorEvent)))


def timed_reserve(manager: SessionManager) -> float:
    began = time.perf_counter()
    try:
        manager.reserve("webrtc")
    finally:
        elapsed = time.perf_counter() - began
    return elapsed


async def test_a_blocked_event_loop_refuses_new_calls_at_once_and_the_live_call_goes_on():
    tight = AdmissionConfig(max_loop_lag_ms=100, lag_window_s=1.0, probe_interval_s=PROBE_S)
    async with Server(tight) as server:
        time.sleep(BLOCK_S)  # no call is live: there is no one to protect, so the first caller is admitted
        assert server.monitor.loop_lag_s * 1000 > tight.max_loop_lag_ms
        timed_reserve(server.manager)
        session, events = server.open()

        async def calm() -> bool:
            return server.monitor.loop_lag_s * 1000 < tight.max_loop_lag_ms

        await wait_for(calm, timeout=10, what="the lag window to pass")
        timed_reserve(server.manager)  # one call live, the loop on time: admitted
        time.sleep(BLOCK_S)  # the event loop's thread is busy: every timer on it runs late
        began = time.perf_counter()
        with pytest.raises(ServerOverloaded) as refused:
            server.manager.reserve("webrtc")
        took = time.perf_counter() - began
        print(f"\nrefused (loop lag {server.monitor.loop_lag_s * 1000:.0f} ms) in {took * 1e6:.0f} us")
        assert took < QUICK_S
        assert refused.value.reason is Refusal.OVERLOADED and refused.value.retry_after_s == tight.retry_after_s
        assert "event loop runs" in str(refused.value) and server.monitor.loop_lag_s >= BLOCK_S - 2 * PROBE_S
        assert server.manager.counters["rejected_overloaded"] == 1
        done = await typed_turn(session, events)  # the admitted call is untouched
        assert isinstance(done, ev.ResponseDone) and done.response.status == "completed"
        await wait_for(calm, timeout=10, what="the lag window to pass")
        timed_reserve(server.manager)  # admitted again


async def test_a_deep_stage_queue_refuses_new_calls_naming_the_stage():
    tight = AdmissionConfig(turn_budget_ms=1000, sample_interval_s=0.1, probe_interval_s=PROBE_S)
    # the voice stage takes one row per step, 0.3 s of compute per second of audio
    async with Server(tight, "--voice.scheduler.max_batch_size", "1") as server:
        session, events = server.open()
        sessions = [server.open() for _ in range(6)]  # six more callers, all asking at once
        for other, _ in sessions:
            other.request_response(ClientTurn(text="tell me a long story about the sea"))

        async def loaded() -> bool:
            return server.monitor.snapshot.turn_wait_s * 1000 > tight.turn_budget_ms

        await wait_for(loaded, timeout=20, what="the queue estimate past the budget")
        began = time.perf_counter()
        with pytest.raises(ServerOverloaded) as refused:
            server.manager.reserve("webrtc")
        took = time.perf_counter() - began
        print(f"\nrefused (estimated turn wait {server.monitor.snapshot.turn_wait_s * 1000:.0f} ms) "
              f"in {took * 1e6:.0f} us")
        assert took < QUICK_S
        assert "most at stage voice" in str(refused.value), str(refused.value)
        for _, other_events in sessions:  # every admitted call still gets its answer
            async def answered(other_events=other_events) -> bool:
                return any(isinstance(e, ev.ResponseDone) for e in other_events)

            await wait_for(answered, timeout=60, what="an admitted caller's answer")
            done = next(e for e in other_events if isinstance(e, ev.ResponseDone))
            assert done.response.status == "completed"
        assert server.manager.live() == 7


async def test_the_default_thresholds_refuse_nothing_on_a_moderately_loaded_server():
    async with Server(AdmissionConfig()) as server:
        sessions = [server.open() for _ in range(4)]
        turns = [asyncio.ensure_future(typed_turn(s, e)) for s, e in sessions]
        while not all(t.done() for t in turns):
            assert timed_reserve(server.manager) < QUICK_S  # raises if refused
            await asyncio.sleep(0.05)
        assert all(isinstance(t.result(), ev.ResponseDone) for t in turns)
        assert server.admission.refusals == {Refusal.OVERLOADED: 0, Refusal.STAGE_DOWN: 0}


async def test_a_stage_that_is_down_refuses_new_calls_and_fails_a_live_turn_with_an_error_event():
    async with Server(AdmissionConfig(), "--supervision.restart", "false") as server:
        session, events = server.open()
        assert isinstance(await typed_turn(session, events), ev.ResponseDone)
        os.kill((await server.coordinator.stats())["voice"].pid, signal.SIGKILL)

        async def down() -> bool:
            return server.coordinator.supervisor.down_error() is not None

        await wait_for(down, timeout=10, what="voice down")
        began = time.perf_counter()
        with pytest.raises(StageDown) as refused:
            server.manager.reserve("webrtc")
        assert time.perf_counter() - began < QUICK_S
        assert refused.value.reason is Refusal.STAGE_DOWN and "stage voice is down" in str(refused.value)
        assert refused.value.retry_after_s >= 1
        error = await typed_turn(session, events)  # at once: an error, not a response stuck responding
        assert isinstance(error, ev.ErrorEvent) and "stage voice is down" in error.error.message
        assert "stage_down" in error.error.message

"""Never a silent hang: a stage process stopped mid-turn (SIGSTOP) is declared dead by the
watchdog, killed and restarted, and its turn gets an error within the watchdog's deadline; with
the watchdog off, the per-request stall deadline fails the turn instead (and the stage, once it
runs again, frees it); a long model step that keeps the GIL busy does not trip the watchdog; a
silence spent waiting for a CPU is not counted, one spent stopped still is.
Real stage processes, real ZeroMQ, real signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from duplex.config import pipeline_from_dict
from duplex.cpu_wait import ProcessActivity
from duplex.models.registry import BUILDERS
from duplex.runtime.contract import ErrorCode, TurnRequest
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import RequestStatus
from duplex.runtime.supervisor import ProcessState
from tests import supervision_helpers
from tests.fake_proc import FakeProcess
from tests.runtime_helpers import stage_holds, toy_pipeline, wait_for

pytestmark = pytest.mark.slow

SLOW = [  # a -> b; each step of b takes 300 ms, so a signal lands while b holds the request
    {"name": "a", "builder": "toy.split", "stream_to": ["b"]},
    {"name": "b", "builder": "toy.upper", "args": {"delay_ms": 300}, "terminal": True},
]
INTERVAL_S = 0.2  # the watchdog's tick: the deadlines below are counted in ticks
TIMEOUT_S = 1.0
# a deadline is noticed on the first tick past it; the last pong may be a tick old; the tick's
# own lateness and the kill's round trip take the rest
TOLERANCE_S = 3 * INTERVAL_S


def _coordinator(stages: list[dict], **supervision) -> Coordinator:
    raw = toy_pipeline(stages, supervision={"watchdog_interval_s": INTERVAL_S, **supervision})
    return Coordinator(pipeline_from_dict(raw), {**BUILDERS, **supervision_helpers.BUILDERS})


@contextlib.contextmanager
def stopped(pid: int):
    """SIGSTOP a process; whatever happens, it is continued afterwards (or is already gone)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def _turn_held_by_b(coord: Coordinator, text: str):
    handle = coord.submit(TurnRequest("s"), {"text": text}, eos=True)
    await wait_for(lambda: stage_holds(coord, "b", handle.request_id), what="b holds the turn")
    return handle, (await coord.stats())["b"].pid


async def test_a_stopped_stage_is_declared_dead_killed_restarted_and_its_turn_fails_in_time():
    async with _coordinator(SLOW, watchdog_timeout_s=TIMEOUT_S, request_stall_s=0) as coord:
        handle, pid = await _turn_held_by_b(coord, "stuck turn")
        try:
            with stopped(pid):
                began = time.monotonic()
                _, finished = await asyncio.wait_for(handle.collect(), TIMEOUT_S + 10)
                waited = time.monotonic() - began
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # never leave a stopped process behind
        assert finished.status is RequestStatus.FAILED and finished.error.code is ErrorCode.STAGE_CRASHED
        assert finished.error.stage == "b" and "stopped answering" in finished.error.message
        print(f"\nSIGSTOP -> the turn's error: {waited:.2f} s (watchdog_timeout_s {TIMEOUT_S}, "
              f"interval {INTERVAL_S})")
        # silence is counted from the last pong, which may have come up to a tick before the stop
        assert TIMEOUT_S - 2 * INTERVAL_S <= waited <= TIMEOUT_S + TOLERANCE_S, waited
        assert coord.supervisor.watchdog_kills == 1 and coord.supervisor.health["b"].watchdog_kills == 1
        health = coord.supervisor.health["b"]

        async def restarted() -> bool:
            return health.state is ProcessState.UP and coord.procs.procs["b"].pid != pid

        await wait_for(restarted, timeout=30, what="b restarted")
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "next turn"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and [c.data["text"] for c in chunks] == ["NEXT", "TURN"]
        await coord.wait_idle(timeout=5)


async def test_without_the_watchdog_the_stall_deadline_fails_the_turn_and_the_stage_frees_it_when_it_runs():
    stall_s = 1.0
    async with _coordinator(SLOW, watchdog_timeout_s=0, request_stall_s=stall_s) as coord:
        handle, pid = await _turn_held_by_b(coord, "stalled turn")
        try:
            with stopped(pid):
                began = time.monotonic()
                _, finished = await asyncio.wait_for(handle.collect(), stall_s + 10)
                waited = time.monotonic() - began
                assert coord.status(handle.request_id) is RequestStatus.FAILED
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise
        assert finished.error.code is ErrorCode.TIMEOUT and finished.error.stage == "b"
        assert "no progress for 1s" in finished.error.message and "waiting on b" in finished.error.message
        # counted from b's last progress report, which came before the stop
        print(f"\nSIGSTOP -> timeout error: {waited:.2f} s after the stop (request_stall_s {stall_s})")
        assert waited <= stall_s + TOLERANCE_S, waited
        assert coord.supervisor.timed_out == 1
        await coord.wait_idle(timeout=10)  # continued, b got the abort and freed the turn
        assert (await coord.stats())["b"].pid == pid and coord.restarts == 0
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "next"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and [c.data["text"] for c in chunks] == ["NEXT"]


async def test_a_long_model_step_holding_the_gil_does_not_trip_the_watchdog():
    busy_s = 2.5 * TIMEOUT_S  # one step, pure Python, far past the watchdog's timeout
    stages = [{"name": "busy", "builder": "test.busy", "args": {"busy_s": busy_s}, "terminal": True}]
    async with _coordinator(stages, watchdog_timeout_s=TIMEOUT_S) as coord:
        pid = (await coord.stats())["busy"].pid
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "slow"}, eos=True).collect(), busy_s + 20)
        assert done.status is RequestStatus.COMPLETED and chunks[0].data["text"] == "SLOW"
        assert chunks[0].data["spins"] > 0
        assert coord.supervisor.watchdog_kills == 0 and coord.restarts == 0
        assert (await coord.stats())["busy"].pid == pid


async def test_a_silence_spent_waiting_for_a_cpu_is_not_counted_and_one_spent_stopped_is(tmp_path):
    async with _coordinator(SLOW, watchdog_timeout_s=TIMEOUT_S, request_stall_s=0) as coord:
        handle, pid = await _turn_held_by_b(coord, "starved turn")
        supervisor = coord.supervisor
        health = supervisor.health["b"]
        files = FakeProcess(tmp_path, pid)  # its counters as the kernel would move them, under a fake /proc
        files.waiting = True
        assert health.silence is not None
        health.silence.activity = ProcessActivity(proc_root=str(tmp_path))
        writer = asyncio.create_task(files.run(INTERVAL_S / 20))
        try:
            with stopped(pid):  # silent; the first part of it "waiting for a CPU"
                async def starved_long() -> bool:
                    return health.silence is not None and health.silence.slow_s >= 3 * TIMEOUT_S

                await wait_for(starved_long, timeout=3 * TIMEOUT_S + 10, what="three watchdog timeouts of starvation")
                # silent three timeouts long, all of it waiting: not killed
                assert supervisor.watchdog_kills == 0 and health.state is ProcessState.UP
                # the counter the metrics export: all but the first tick (its answer was not yet due)
                assert health.cpu_wait_s >= 3 * TIMEOUT_S - 2 * INTERVAL_S
                files.waiting = False  # from now on it is silent and not waiting: hung
                began = time.monotonic()
                _, finished = await asyncio.wait_for(handle.collect(), TIMEOUT_S + 10)
                waited = time.monotonic() - began
        finally:
            writer.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert finished.error.code is ErrorCode.STAGE_CRASHED and "stopped answering" in finished.error.message
        assert "waiting for a CPU" in finished.error.message, finished.error.message
        assert waited <= TIMEOUT_S + TOLERANCE_S, waited
        assert supervisor.watchdog_kills == 1

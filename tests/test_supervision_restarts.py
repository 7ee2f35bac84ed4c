"""Restarts under a budget that is a rate, and a stage that is down: real stage processes, real
ZeroMQ, real SIGKILL. A stage killed again and again fails each request it held, is restarted
while the budget (N per window) allows, is down (new requests fail at once, naming it) while it
does not, and serves again once the window lets it back; a restart that fails leaves it down
until the next try works."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest

from duplex.config import pipeline_from_dict
from duplex.models.registry import BUILDERS
from duplex.runtime.contract import ErrorCode, TurnRequest
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import RequestStatus
from duplex.runtime.supervisor import ProcessState
from tests import supervision_helpers
from tests.runtime_helpers import stage_holds, toy_pipeline, wait_for

pytestmark = pytest.mark.slow

SLOW = [  # a -> b; each step of b takes 300 ms, so a kill lands while b holds the request
    {"name": "a", "builder": "toy.split", "stream_to": ["b"]},
    {"name": "b", "builder": "toy.upper", "args": {"delay_ms": 300}, "terminal": True},
]
WINDOW_S = 4.0
BUDGET = 3


def _coordinator(stages: list[dict], **supervision) -> Coordinator:
    raw = toy_pipeline(stages, supervision=supervision)
    return Coordinator(pipeline_from_dict(raw), {**BUILDERS, **supervision_helpers.BUILDERS})


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _settled(coord: Coordinator, process: str) -> ProcessState:
    """Wait until the process is up or down (not restarting); its state then."""
    health = coord.supervisor.health[process]

    async def settled() -> bool:
        return health.state is not ProcessState.RESTARTING

    await wait_for(settled, timeout=30, what=f"{process} up or down")
    return health.state


async def _up(coord: Coordinator, process: str, timeout: float = 30) -> None:
    health = coord.supervisor.health[process]

    async def up() -> bool:
        return health.state is ProcessState.UP

    await wait_for(up, timeout=timeout, what=f"{process} up")


async def test_a_stage_killed_ten_times_fails_each_request_is_down_while_the_budget_is_spent_and_heals():
    async with _coordinator(SLOW, max_restarts=BUDGET, restart_window_s=WINDOW_S, watchdog_timeout_s=0) as coord:
        health = coord.supervisor.health["b"]
        killed, downs = [], 0
        for kill in range(10):
            handle = coord.submit(TurnRequest("s"), {"text": f"doomed{kill}"}, eos=True)
            rid = handle.request_id
            await wait_for(lambda rid=rid: stage_holds(coord, "b", rid), what="b holds the request")
            pid = (await coord.stats())["b"].pid
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            _, finished = await asyncio.wait_for(handle.collect(), 10)
            assert finished.status is RequestStatus.FAILED  # every affected request gets an error
            assert finished.error.code is ErrorCode.STAGE_CRASHED and finished.error.stage == "b"
            assert "died with exit code -9" in finished.error.message
            if await _settled(coord, "b") is ProcessState.DOWN:
                downs += 1
                assert len(health.restarts) == BUDGET  # spent within the window
                began = time.monotonic()
                refused = coord.submit(TurnRequest("s"), {"text": "while down"}, eos=True)
                # at once: the handle is failed before submit returns, nothing waits on the stage
                assert refused.status is RequestStatus.FAILED and refused.error.code is ErrorCode.STAGE_DOWN
                assert refused.error.stage == "b" and "stage b is down" in refused.error.message
                assert "next try in" in refused.error.message and time.monotonic() - began < 0.05
                assert 0 < coord.supervisor.retry_after_s() <= WINDOW_S
                await _up(coord, "b", timeout=WINDOW_S + 30)  # the window refilled: back
        assert downs >= 2  # 10 kills over a budget of 3 per window: spent more than once
        assert coord.restarts == 10 and coord.procs.restarts["b"] == 10
        assert not [pid for pid in killed if _alive(pid)]
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "again"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and [c.data["text"] for c in chunks] == ["AGAIN"]
        await coord.wait_idle(timeout=5)


async def test_a_restart_that_fails_leaves_the_stage_down_until_a_later_try_works(tmp_path):
    flag = tmp_path / "refuse-to-start"
    stages = [{"name": "a", "builder": "toy.split", "stream_to": ["b"]},
              {"name": "b", "builder": "test.flaky", "args": {"fail_if": str(flag)}, "terminal": True}]
    async with _coordinator(stages, max_restarts=2, restart_window_s=2.0, watchdog_timeout_s=0) as coord:
        health = coord.supervisor.health["b"]
        live = coord.submit(TurnRequest("s"))  # waits on b (no input yet, so b has not passed it)
        flag.touch()
        os.kill((await coord.stats())["b"].pid, signal.SIGKILL)
        _, finished = await asyncio.wait_for(live.collect(), 5)  # the death fails it
        assert finished.status is RequestStatus.FAILED and finished.error.stage == "b"
        assert await _settled(coord, "b") is ProcessState.DOWN
        assert "restart of stage b failed" in health.reason and "exited with code 1" in health.reason
        refused = coord.submit(data={"text": "x"}, eos=True)
        assert refused.status is RequestStatus.FAILED and refused.error.code is ErrorCode.STAGE_DOWN
        with pytest.raises(TimeoutError, match="'b'"):  # stats name the stage that is not there ...
            await coord.stats(timeout=1)
        views = await coord.collect_stats(timeout=1)  # ... and still answer for the others
        assert set(views) == {"a"}
        flag.unlink()
        await _up(coord, "b")  # the next try, when the budget's pace allows, works
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "healed"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and [c.data["text"] for c in chunks] == ["HEALED"]
        assert coord.supervisor.down_error() is None

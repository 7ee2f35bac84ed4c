"""The edge's collection of ended calls' garbage: in process (``MemoryKeeper``), then on a real
server, where ended aiortc calls must not leave their threads behind."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import httpx
import numpy as np
import pytest

from duplex.edge.memory import MemoryKeeper
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.probes import ask, hear


class _Cycle:
    """An object in a reference cycle, as an ended call's peer connection and its transports are."""

    def __init__(self) -> None:
        self.me = self


def test_a_collection_runs_only_after_a_call_ended_and_frees_its_cycles():
    ended, live = [0], [0]
    keeper = MemoryKeeper(ended=lambda: ended[0], live=lambda: live[0], batch_calls=3)
    gc.disable()  # the automatic collector must not do the keeper's work here
    try:
        garbage = _Cycle()
        watch = weakref.ref(garbage)
        del garbage
        assert not keeper.collect_if_calls_ended()  # no call ended: nothing runs
        assert watch() is not None and keeper.stats.runs == 0
        ended[0] = 1
        assert keeper.collect_if_calls_ended()
        assert watch() is None
        assert keeper.stats.runs == 1 and keeper.stats.collected >= 1
        assert not keeper.collect_if_calls_ended()  # once per ended call(s), not every tick
        assert keeper.stats_view()["calls_seen"] == 1
        live[0] = 5  # while calls are live, their loop's pause waits for a batch of ended calls
        ended[0] = 3
        assert not keeper.collect_if_calls_ended()
        ended[0] = 4
        assert keeper.collect_if_calls_ended() and keeper.stats.runs == 2
    finally:
        gc.enable()


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


async def _stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/duplex/stats")).json()


async def _collected_after_every_call(url: str, timeout: float = 20.0) -> dict:
    """Stats once the keeper has run after the last call ended (it runs within 2 s of one)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await _stats(url)
        memory, sessions = stats["edges"]["memory"], stats["sessions"]
        if sessions["live"] == 0 and memory["calls_seen"] == sessions["closed"] > 0:
            return stats
        assert time.monotonic() < deadline, f"no collection after the last call: {memory}, {sessions}"
        await asyncio.sleep(0.1)


async def _one_call(url: str, question: np.ndarray) -> None:
    client = RealtimeClient(url)
    await client.connect()
    try:
        created_at = time.monotonic()
        await ask(client, question)
        await hear(client, created_at, 0.3)
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.usefixtures("loopback_candidates")
async def test_ended_calls_leave_no_threads_behind():
    question = espeak("Could you tell me what time it is")
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "4"]) as server:
        assert server.pid is not None
        await _one_call(server.url, question)  # the first call starts what every call shares (pools, codecs)
        await _collected_after_every_call(server.url)
        baseline = _threads(server.pid)
        for _ in range(6):
            await _one_call(server.url, question)
        stats = await _collected_after_every_call(server.url)
        # Each call's aiortc objects hold threads of their own until collected: 6 uncollected
        # calls leave several each; collected, the count is back where one call left it.
        assert _threads(server.pid) <= baseline + 1, (baseline, _threads(server.pid), stats["edges"]["memory"])
        assert stats["edges"]["memory"]["frozen_objects"] > 10_000  # start-up's objects are never scanned again

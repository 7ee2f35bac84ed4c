"""Abort -> every stage holds nothing: how long it takes, measured on a live staged pipeline.

Each trial starts a turn, aborts it at a point of its life (mid-thinker, mid-talker, while
audio streams) and polls every stage's stats until none holds anything. The time reported is
from the abort to the reply of the first poll that found every stage empty (an upper bound;
the poll before it, still non-empty, gives the lower bound).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from duplex.runtime.contract import SESSION_RATE, CallerAudio, TurnRequest
from duplex_tools.report import percentile

POINTS = ("mid_thinker", "mid_talker", "mid_vocoder")
# long enough to abort mid-way
ABORT_REQUEST = TurnRequest(session_id="bench-aborts", max_new_tokens=30, options={"talker_max_new_tokens": 200})
MAX_POLL_S = 5.0
POLL_INTERVAL_S = 0.002


def _reached(point: str, event, thinker_chunks: int) -> bool:
    return (point == "mid_thinker" and thinker_chunks == 2
            or point == "mid_talker" and event.stage == "thinker" and event.final
            or point == "mid_vocoder" and event.stage == "code2wav")


async def _one(coord, point: str, seed: int) -> dict:
    from duplex.runtime.requests import OutputChunk

    audio = (0.1 * np.random.default_rng(seed).standard_normal(SESSION_RATE)).astype(np.float32)
    handle = coord.submit(ABORT_REQUEST)
    coord.feed(handle.request_id, CallerAudio(audio), eos=True)
    thinker_chunks = 0
    async for event in handle:
        if not isinstance(event, OutputChunk):
            raise RuntimeError(f"turn ended {event.status.value} before the abort point {point}")
        thinker_chunks += event.stage == "thinker"
        if _reached(point, event, thinker_chunks):
            break
    aborted = time.monotonic()
    coord.abort(handle.request_id)
    last_busy, holders = aborted, dict[str, dict]()
    while time.monotonic() - aborted < MAX_POLL_S:
        stats = await coord.stats()
        if all(view.held == 0 for view in stats.values()):
            return {"point": point, "zero_ms": (time.monotonic() - aborted) * 1e3,
                    "last_busy_ms": (last_busy - aborted) * 1e3, "last_holders": holders}
        last_busy = time.monotonic()
        await asyncio.sleep(POLL_INTERVAL_S)  # a tight poll would itself starve the stages of the 2 cores
        holders = {name: {k: v for k, v in view.resources.items() if v} | {"live": view.live_requests}
                   for name, view in stats.items() if view.held}
    raise TimeoutError(f"stages still hold state {MAX_POLL_S}s after an abort {point}: {holders}")


async def measure_aborts(coord, trials: int) -> dict:
    results = [await _one(coord, POINTS[i % len(POINTS)], 500 + i) for i in range(trials)]
    zero = [r["zero_ms"] for r in results]
    summary = {"trials": results, "p50_ms": percentile(zero, 50), "p95_ms": percentile(zero, 95), "max_ms": max(zero)}
    for point in POINTS:
        mine = [r["zero_ms"] for r in results if r["point"] == point]
        if mine:
            summary[f"{point}_max_ms"] = max(mine)
    return summary

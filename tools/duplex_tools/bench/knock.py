"""Knocks on a full server's door (``duplex bench load --knock-rate``): while a level's callers
are live, more callers offer calls at a steady rate. Each answer is timed; a refusal must be a 503
with ``Retry-After``, and a call the server admits anyway (a slot came free between two calls) is
hung up at once, so the knocks hold nothing. What it shows: how fast the server says "full", and
(side by side with the same level without knocks) that the calls it keeps do not slow down."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from duplex_tools.offer import offer_sdp


@dataclass
class Knocks:
    rate_per_s: float
    answers: Counter = field(default_factory=Counter)  # HTTP status -> how many
    refused_ms: list[float] = field(default_factory=list)  # offer sent -> 503 received
    without_retry_after: int = 0  # 503s that did not say when to come back
    admitted: int = 0  # 201s (hung up at once)
    errors: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(self.answers.values()) + len(self.errors)


async def knock_until(url: str, rate_per_s: float, stop: asyncio.Event, api_key: str | None = None,
                      max_knocks: int | None = None) -> Knocks:
    """Offer a call every ``1 / rate_per_s`` seconds (one at a time) until ``stop`` is set (or
    ``max_knocks`` were sent)."""
    knocks = Knocks(rate_per_s)
    sdp = await offer_sdp()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    interval = 1.0 / rate_per_s
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http:
        due = time.monotonic()
        while not stop.is_set() and (max_knocks is None or knocks.sent < max_knocks):
            await _knock(http, sdp, knocks)
            due += interval
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
            except TimeoutError:
                pass
    return knocks


async def _knock(http: httpx.AsyncClient, sdp: str, knocks: Knocks) -> None:
    started = time.perf_counter()
    try:
        reply = await http.post("/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp"})
    except httpx.HTTPError as exc:
        knocks.errors.append(f"{type(exc).__name__}: {exc}"[:160])
        return
    elapsed_ms = (time.perf_counter() - started) * 1000
    knocks.answers[reply.status_code] += 1
    if reply.status_code == 503:
        knocks.refused_ms.append(elapsed_ms)
        knocks.without_retry_after += "retry-after" not in reply.headers
    elif reply.status_code == 201:
        knocks.admitted += 1
        await http.delete(reply.headers["Location"])

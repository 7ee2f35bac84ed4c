"""Reading the server's ``GET /duplex/stats`` during a run: which runtime requests are live in
which stage, whether everything was let go, and our session's own counters."""

from __future__ import annotations

import asyncio
import time

import httpx

BUSY_STATES = ("responding", "agent_speaking")


class StatsError(RuntimeError):
    pass


class ServerStats:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def get(self) -> dict:
        reply = await self._http.get("/duplex/stats", params={"detail": "1"})  # ids: the host's own tools
        if reply.status_code != 200:
            raise StatsError(f"GET /duplex/stats: {reply.status_code} {reply.text[:200]}")
        return reply.json()

    async def playing_request_ids(self, session_id: str, exclusive: bool) -> list[str] | None:
        """The runtime request(s) of the response our session is answering with, or None when
        it is not answering (or we cannot tell). The session names its request when the server
        is new enough; otherwise, on a server that is ours alone, every live request is ours."""
        current = await self.get()
        session = current.get("sessions", {}).get("sessions", {}).get(session_id)
        if session is None or session.get("state") not in BUSY_STATES:
            return None
        if session.get("request_id"):
            return [session["request_id"]]
        return sorted(live_request_ids(current)) if exclusive else None

    async def wait_released(self, request_ids: list[str], timeout: float, interval: float = 0.01) -> float:
        """Poll until no stage lists any of ``request_ids``; returns the monotonic time at which
        that was first seen. Raises StatsError with what was still held after ``timeout``."""
        wanted = set(request_ids)
        deadline = time.monotonic() + timeout
        while True:
            asked = time.monotonic()
            current = await self.get()
            # a stage that did not answer in time may hold any of them: not released yet
            held = wanted if silent_stages(current) else wanted & live_request_ids(current)
            if not held:
                return asked
            if time.monotonic() > deadline:
                raise StatsError(f"requests still held after {timeout:.1f} s: {sorted(held)}")
            await asyncio.sleep(interval)

    async def wait_idle(self, timeout: float, no_sessions: bool = False, interval: float = 0.05) -> dict:
        """Poll until every stage holds nothing (and, with ``no_sessions``, no call is live at
        any door); raises StatsError naming what is still held."""
        deadline = time.monotonic() + timeout
        while True:
            current = await self.get()
            held = held_resources(current) | (live_calls(current) if no_sessions else {})
            if not held:
                return current
            if time.monotonic() > deadline:
                raise StatsError(f"still held after {timeout:.1f} s: {held}")
            await asyncio.sleep(interval)


def live_request_ids(stats: dict) -> set[str]:
    ids: set[str] = set()
    for name, stage in stats.get("stages", {}).items():
        if "request_ids" not in stage:
            raise StatsError(f"/duplex/stats lists no request_ids for stage {name!r}: the server is too old")
        ids.update(stage["request_ids"])
    return ids


def held_resources(stats: dict) -> dict[str, int]:
    """Everything any stage still holds, as 'stage.what' -> count (empty when all is free)."""
    held: dict[str, int] = {name + ".not_answering": 1 for name in silent_stages(stats)}  # unknown: held
    for name, stage in stats.get("stages", {}).items():
        if stage.get("live_requests"):
            held[f"{name}.live_requests"] = stage["live_requests"]
        for key, value in stage.get("resources", {}).items():
            if value:
                held[f"{name}.{key}"] = value
    return held


def live_calls(stats: dict) -> dict[str, int]:
    """The sessions and the doors' calls still live, as 'where' -> count (empty when none is)."""
    edges = stats.get("edges", {})
    counts = {"sessions.live": stats.get("sessions", {}).get("live"),
              "webrtc.live_sessions": edges.get("webrtc", {}).get("live_sessions"),
              "sip.calls": edges.get("sip", {}).get("calls")}
    return {where: count for where, count in counts.items() if count}


def silent_stages(stats: dict) -> list[str]:
    """Stages whose stats did not come in time (stopped, wedged, restarting): what they hold is unknown."""
    return [name for name, stage in stats.get("stages", {}).items()
            if stage.get("answering") is False or stage.get("live_requests") is None]

"""The server's outside view for operators and load balancers: ``GET /metrics`` (Prometheus text
format), ``GET /healthz`` (the process answers) and ``GET /readyz`` (it would take a call now, with
a load figure a balancer can weigh). What the answers say is the server room's (``Watch``); this
module only speaks HTTP.

``/readyz`` answers 503 while draining (SIGTERM), while a stage is down or restarting (the reasons
name it and say when it is tried again), or when every session slot is taken, so a balancer
health-checking it sends new calls elsewhere; live calls are untouched."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST  # the text format generate_latest writes


@dataclass(frozen=True)
class Readiness:
    ready: bool
    load: float  # live sessions / session limit: 0 idle, 1 full
    sessions: int
    max_sessions: int
    draining: bool
    reasons: list[str] = field(default_factory=list)  # why not ready
    stages: dict[str, str] = field(default_factory=dict)  # stage -> up | restarting | down


class Watch(Protocol):
    def metrics_enabled(self) -> bool: ...
    async def metrics(self) -> bytes: ...
    async def readiness(self) -> Readiness: ...


def add_health_routes(app: FastAPI, watch: Watch) -> None:
    """The API key, when the server has one, guards ``/metrics`` like every other route (the
    edge's ``auth.AccessMiddleware``); ``/healthz`` and ``/readyz`` are open (``auth._public``):
    balancers probe them without keys."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        state = await watch.readiness()
        return JSONResponse(asdict(state), status_code=200 if state.ready else 503,
                            headers={"X-Duplex-Load": f"{state.load:.3f}"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        if not watch.metrics_enabled():
            return JSONResponse({"error": {"type": "not_found", "message": "metrics are off (--no-metrics)"}},
                                status_code=404)
        return Response(await watch.metrics(), media_type=CONTENT_TYPE_LATEST)

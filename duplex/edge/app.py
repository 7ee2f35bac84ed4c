"""The HTTP surface: demo page, Realtime WebRTC signalling, stats."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from duplex.edge.sdp import OfferError
from duplex.edge.signalling import SignallingError, read_call_request
from duplex.edge.webrtc import WebRTCGateway
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.port import VoiceRuntime

log = logging.getLogger("duplex.edge")
WEB_DIR = Path(str(files("duplex") / "web"))  # the demo page ships inside the package (package data)
CALLS_PATH = "/v1/realtime/calls"


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def create_app(runtime: VoiceRuntime, sessions: SessionManager, gateway: WebRTCGateway,
               other_edges: dict[str, Callable[[], dict]] | None = None, web_dir: Path = WEB_DIR) -> FastAPI:
    """``other_edges``: stats providers of further transports (e.g. SIP), shown in /duplex/stats."""
    app = FastAPI(title="duplex", docs_url=None, redoc_url=None)
    edges: dict[str, Callable[[], dict]] = {"webrtc": gateway.stats, **(other_edges or {})}

    @app.get("/", include_in_schema=False)
    async def demo_page() -> FileResponse:
        return FileResponse(web_dir / "index.html", media_type="text/html")

    app.mount("/web", StaticFiles(directory=web_dir), name="web")

    @app.post(CALLS_PATH)
    async def create_call(request: Request) -> Response:
        try:
            call = await read_call_request(request)
            call_id, answer = await gateway.answer(call.sdp, call.settings)
        except SignallingError as exc:
            return _error(exc.status, str(exc))
        except SessionsFull as exc:
            return _error(503, str(exc), "server_busy", {"Retry-After": "5"})
        except OfferError as exc:
            return _error(400, str(exc))
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"{CALLS_PATH}/{call_id}"})

    @app.delete(CALLS_PATH + "/{call_id}")
    async def hang_up(call_id: str) -> Response:
        if not await gateway.hang_up(call_id):
            return _error(404, f"no call {call_id!r}", "not_found")
        return Response(status_code=204)

    @app.get("/duplex/stats")
    async def stats() -> JSONResponse:
        try:
            stages = await runtime.stats()
        except TimeoutError as exc:
            return _error(503, f"stages did not report: {exc}", "stats_unavailable")
        return JSONResponse({"pipeline": sessions.model, "stages": stages,
                             "edges": {name: provider() for name, provider in edges.items()},
                             "sessions": sessions.stats()})

    return app

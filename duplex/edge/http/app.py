"""The HTTP surface: demo page, Realtime WebRTC signalling, stats."""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path

import msgspec
from fastapi import FastAPI, Request, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from duplex.edge.config import AccessConfig, RealtimeLimits
from duplex.edge.http import guard
from duplex.edge.http import protocol as http_protocol
from duplex.edge.http.auth import (
    DEMO_SECRET_PATH,
    OPEN,
    SECRETS_PATH,
    Access,
    AccessMiddleware,
    AuthError,
    Credential,
    owner_of,
)
from duplex.edge.http.guard import DoorGuard
from duplex.edge.http.signalling import SignallingError, read_call_request
from duplex.edge.http.stats_view import detail_allowed, redact
from duplex.edge.plugin import DoorPlugin
from duplex.edge.rate import DoorAdmission, RateLimited
from duplex.edge.realtime_ws.door import REALTIME_PATH, RealtimeDoor, refuse_rate_limited
from duplex.edge.webrtc.gateway import WebRTCGateway, split_path_id
from duplex.edge.webrtc.offer import OfferError
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.observe import Refusal
from duplex.session.port import VoiceRuntime
from duplex.session.protocol import apply_settings
from duplex.session.realtime import events as ev

log = logging.getLogger("duplex.edge")
WEB_DIR = Path(str(files("duplex") / "web"))  # the demo page ships inside the package (package data)
CALLS_PATH = "/v1/realtime/calls"


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def _credential(request: Request | WebSocket) -> Credential:
    return getattr(request.state, "credential", OPEN)


def create_app(runtime: VoiceRuntime, sessions: SessionManager, gateway: WebRTCGateway,
               other_edges: dict[str, Callable[[], dict]] | None = None, web_dir: Path = WEB_DIR,
               access: Access | None = None, limits: RealtimeLimits | None = None,
               doors: Sequence[DoorPlugin] = ()) -> FastAPI:
    """``other_edges``: stats providers of further parts (the edge process's memory, the media
    workers), shown in /duplex/stats; ``doors``: plug-ins (``edge/plugin``: SIP, Twilio, your
    own) whose routes are mounted behind the same guard and key and whose stats are shown too.
    ``access``: who may use it (``auth.py``; open by default); ``limits``: of WebSocket sessions."""
    app = FastAPI(title="duplex", docs_url=None, redoc_url=None)
    access = access or Access(AccessConfig())
    edge = gateway.config
    door = RealtimeDoor(sessions, limits or edge.realtime)
    app.state.realtime = door
    admissions = {door_name: DoorAdmission(edge.call_rate, label, edge.max_sessions, edge.connect_timeout_s,
                                           edge.limit_loopback)
                  for door_name, label in (("webrtc", "WebRTC"), ("websocket", "WebSocket"))}
    app.add_middleware(AccessMiddleware, access=access)
    app.add_middleware(CORSMiddleware, allow_origins=edge.allowed_origins, allow_methods=["GET", "POST", "DELETE"],
                       allow_headers=["Authorization", "Content-Type"], expose_headers=["Location"], max_age=600)
    app.add_middleware(DoorGuard, config=edge)  # outermost: Host, Origin, body; then CORS; then the key
    edges: dict[str, Callable[[], dict]] = {
        "webrtc": lambda: gateway.stats() | {"rate": admissions["webrtc"].stats()},
        "websocket": lambda: door.stats() | {"rate": admissions["websocket"].stats()},
        "http": lambda: http_protocol.COUNTERS | guard.REFUSED, "access": access.stats, **(other_edges or {})}
    for plugin in doors:
        if plugin.name in edges:
            raise ValueError(f"door {plugin.name!r}: /duplex/stats already shows an edge of that name")
        edges[plugin.name] = plugin.stats

    sockets: set[str] = set()  # live WebSocket sessions, as the access records name them

    def live(call_id: str) -> bool:
        return call_id in gateway.calls or call_id in sockets

    @app.websocket(REALTIME_PATH)
    async def realtime(websocket: WebSocket) -> None:
        credential = _credential(websocket)
        try:
            pending = admissions["websocket"].admit(_source(websocket))
        except RateLimited as exc:
            sessions.refused("websocket", _refusal_reason(exc))
            access.release(credential)
            await refuse_rate_limited(websocket, exc)
            return
        connection_id = f"ws_{secrets.token_hex(16)}"
        sockets.add(connection_id)
        access.opened(connection_id, credential, live)
        try:
            await door.serve(websocket, credential.settings, pending, owner_of(credential))
        finally:
            pending.release()
            sockets.discard(connection_id)
            access.forget(connection_id)

    @app.post(SECRETS_PATH)
    async def client_secret(request: Request) -> Response:
        try:
            ttl, settings = _secret_request(await request.body())
            if settings is not None:
                apply_settings(sessions.config, settings)  # refused now, not when the call opens
            secret = access.mint(ttl, settings)
        except AuthError as exc:
            return _auth_error(exc)
        except ValueError as exc:
            return _error(400, str(exc))
        return _secret_reply(secret)

    @app.post(DEMO_SECRET_PATH, include_in_schema=False)
    async def demo_secret() -> Response:
        """The demo page's own secret, when the server lets the page in without the key."""
        if not access.enabled:
            return _error(404, "this server needs no key: call it directly", "not_found")
        if not access.config.demo_open:
            return _error(403, "the demo page is closed on this server (start it with --demo-open)",
                          "permission_error")
        try:
            return _secret_reply(access.mint())
        except AuthError as exc:
            return _auth_error(exc)

    @app.get("/", include_in_schema=False)
    async def demo_page() -> FileResponse:
        return FileResponse(web_dir / "index.html", media_type="text/html")

    app.mount("/web", StaticFiles(directory=web_dir), name="web")

    @app.post(CALLS_PATH)
    async def create_call(request: Request) -> Response:
        credential = _credential(request)
        try:
            pending = admissions["webrtc"].admit(_source(request))
        except RateLimited as exc:
            sessions.refused("webrtc", _refusal_reason(exc))
            access.release(credential)  # refused: a client secret is not spent on it
            return _refusal(exc)
        try:
            call = await read_call_request(request)
            opened, answer = await gateway.answer(call.sdp, call.settings or credential.settings, pending,
                                                  owner_of(credential))
            access.opened(opened.id, credential, live)
        except (SignallingError, SessionsFull, OfferError) as exc:
            pending.release()
            access.release(credential)
            return _refusal(exc)
        except BaseException:
            pending.release()
            raise
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"{CALLS_PATH}/{opened.path_id}"})

    @app.delete(CALLS_PATH + "/{call_id}")
    @app.post(CALLS_PATH + "/{call_id}/hangup")
    async def hang_up(call_id: str, request: Request) -> Response:
        public_id, refusal = _own_call(call_id, request)
        if refusal is not None:
            return refusal
        if not await gateway.hang_up(public_id):
            access.forget(public_id)
            return _error(404, f"no call {call_id!r}", "not_found")
        access.forget(public_id)
        return Response(status_code=204)

    @app.get(CALLS_PATH + "/{call_id}")
    async def inspect_call(call_id: str, request: Request) -> Response:
        public_id, refusal = _own_call(call_id, request)
        if refusal is not None:
            return refusal
        call = gateway.calls[public_id]
        session = call.session
        return JSONResponse({"id": call_id, "object": "realtime.call", "status": call.state,
                             "session": session.stats() | {"id": session.session_id} if session else None})

    def _own_call(path_id: str, request: Request) -> tuple[str, Response | None]:
        """(the call's public id, a refusal): the Location's token must match (even with no key
        configured), then the credential must be the opener's (auth.py)."""
        public_id, token = split_path_id(path_id)
        call = gateway.calls.get(public_id)
        if call is None:
            access.forget(public_id)  # ended already (its peer left): no owner to keep
            return public_id, _error(404, f"no call {path_id!r}", "not_found")
        if not call.owns(token):
            return public_id, _error(403, "this call id lacks its token or the token is wrong: use the Location "
                                          "the call was opened with", "permission_error")
        try:
            access.check_owner(public_id, _credential(request))
        except AuthError as exc:
            return public_id, _auth_error(exc)
        return public_id, None

    @app.get("/duplex/stats")
    async def stats(request: Request) -> JSONResponse:
        try:
            stages = await runtime.stats()
        except TimeoutError as exc:
            return _error(503, f"stages did not report: {exc}", "stats_unavailable")
        view = {"pipeline": sessions.model, "stages": stages,
                "edges": {name: provider() for name, provider in edges.items()}, "sessions": sessions.stats()}
        detail = detail_allowed(request.query_params.get("detail") == "1", _credential(request), access.enabled,
                                request.client.host if request.client else None)
        return JSONResponse(view if detail else redact(view))

    for plugin in doors:  # after the built-in routes, which a door's path cannot shadow
        router = plugin.router()
        if router is not None:  # the middleware above wraps the whole app: these routes too
            app.include_router(router)
    return app


def _refusal(exc: RateLimited | SignallingError | SessionsFull | OfferError) -> Response:
    if isinstance(exc, RateLimited):
        return _error(429, str(exc), "rate_limit_error", {"Retry-After": str(exc.retry_after)})
    if isinstance(exc, SignallingError):
        return _error(exc.status, str(exc))
    if isinstance(exc, SessionsFull):
        return _error(503, str(exc), "server_busy", {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})
    return _error(400, str(exc))


def _refusal_reason(limited: RateLimited) -> Refusal:
    return Refusal.PENDING_CAPPED if limited.pending else Refusal.RATE_LIMITED


def _source(request: Request | WebSocket) -> str:
    """The caller's address: the peer's, or behind a trusted proxy (``--trusted-proxy``) the one
    it forwarded (uvicorn's proxy headers have set it by now)."""
    return request.client.host if request.client else "unknown"


def _auth_error(exc: AuthError) -> Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return Response(exc.body(), status_code=exc.status, media_type="application/json", headers=headers)


class _SecretRequest(msgspec.Struct, kw_only=True):
    class Expiry(msgspec.Struct, kw_only=True):
        anchor: str = "created_at"
        seconds: float = 600.0

    expires_after: Expiry | None = None
    session: ev.SessionSettings | None = None


def _secret_request(body: bytes) -> tuple[float | None, ev.SessionSettings | None]:
    """The body of POST /v1/realtime/client_secrets (empty, or OpenAI's shape). Raises ValueError."""
    if not body.strip():
        return None, None
    try:
        request = msgspec.json.decode(body, type=_SecretRequest)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"client secret request: {exc}") from None
    expiry = request.expires_after
    if expiry is not None and (expiry.anchor != "created_at" or not 1 <= expiry.seconds <= 7200):
        raise ValueError("expires_after: anchor 'created_at' and seconds within 1..7200")
    return (expiry.seconds if expiry else None), request.session


def _secret_reply(secret) -> JSONResponse:
    return JSONResponse({"value": secret.value, "expires_at": int(secret.expires_at),
                         "session": {"type": "realtime"} if secret.settings is None
                         else msgspec.to_builtins(secret.settings)})

"""The HTTP face of placed calls, mounted by the SIP door: ``POST /v1/calls/outbound`` asks for a
call (201: its id and state; the outcome comes later), ``GET /v1/calls/outbound/{id}`` tells its
state, final SIP status and events, ``DELETE`` cancels it (ringing) or hangs it up (answered).

Placing a call costs money and reaches people, so it needs the API key: the server's middleware
lets no client secret through to these paths, and a server without a key places calls only for
clients on its own host (as it serves recordings only there)."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from duplex.edge.phone.amd import AmdPolicy
from duplex.edge.phone.bridge import CallOpening
from duplex.edge.phone.session_agent import opening_errors
from duplex.edge.sip.outbound import OutboundCalls, OutboundRefused
from duplex.session.manager import SessionManager
from duplex.session.realtime.events import SessionSettings

OUTBOUND_PATH = "/v1/calls/outbound"
MAX_BODY = 64 * 1024


class OutboundAsk(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    to: Annotated[str, msgspec.Meta(max_length=256)]  # the SIP URI to call
    session: SessionSettings | None = None  # instructions, tools, voice, turn detection (Realtime shape)
    first_message: Annotated[str, msgspec.Meta(max_length=2000)] = ""  # said when the callee answers
    # screen for an answering machine (``edge/phone/amd``) and, if one answers, leave the first
    # message after its beep or hang up; absent: no screening, the first message at once
    answering_machine: AmdPolicy | None = None


def _error(status: int, code: str, message: str, retry_after_s: int | None = None) -> JSONResponse:
    kind = {400: "invalid_request_error", 403: "permission_error", 404: "not_found", 413: "invalid_request_error",
            429: "rate_limit_error", 503: "server_busy"}.get(status, "invalid_request_error")
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse({"error": {"type": kind, "code": code, "message": message}}, status_code=status,
                        headers=headers)


def _view(placed_view: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(placed_view), status_code=status, media_type="application/json")


def _local_only(request: Request) -> JSONResponse | None:
    """The middleware checked the key where there is one; with none (credential kind "open"),
    only this host's clients may place calls."""
    credential = getattr(request.state, "credential", None)
    if getattr(credential, "kind", "open") != "open":
        return None
    host = request.client.host if request.client else ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return _error(403, "outbound_needs_api_key", "this server has no API key: it places calls only for clients on "
                                                 "its own host (start it with --api-key)")


def outbound_router(outbound: OutboundCalls, sessions: SessionManager) -> APIRouter:
    router = APIRouter()

    @router.post(OUTBOUND_PATH)
    async def place(request: Request) -> Response:
        refused = _local_only(request)
        if refused is not None:
            return refused
        body = await request.body()
        if len(body) > MAX_BODY:
            return _error(413, "body_too_large", f"the request body is over {MAX_BODY} bytes")
        try:
            ask = msgspec.json.decode(body, type=OutboundAsk)
        except msgspec.DecodeError as exc:
            return _error(400, "invalid_request", f"bad outbound call request: {exc}")
        problem = opening_errors(sessions, ask.session) if ask.session is not None else None
        if problem is not None:
            return _error(400, "invalid_session_settings", problem)
        try:
            placed = outbound.place(ask.to, CallOpening(ask.session, ask.first_message, ask.answering_machine))
        except OutboundRefused as exc:
            return _error(exc.status, exc.code, str(exc), exc.retry_after_s)
        return _view(placed.view(), 201)

    @router.get(OUTBOUND_PATH + "/{call_id}")
    async def look(request: Request, call_id: str) -> Response:
        refused = _local_only(request)
        if refused is not None:
            return refused
        placed = outbound.placed.get(call_id)
        if placed is None:
            return _error(404, "call_not_found", f"no placed call {call_id[:80]!r}")
        return _view(placed.view())

    @router.delete(OUTBOUND_PATH + "/{call_id}")
    async def end(request: Request, call_id: str) -> Response:
        refused = _local_only(request)
        if refused is not None:
            return refused
        placed = outbound.placed.get(call_id)
        if placed is None:
            return _error(404, "call_not_found", f"no placed call {call_id[:80]!r}")
        outbound.hang_up(placed)
        return _view(placed.view())

    return router

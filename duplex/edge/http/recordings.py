"""The recordings API: ``GET /v1/recordings`` (the asker's recordings), ``GET /v1/recordings/{id}``
(the WAV), ``GET /v1/recordings/{id}/events`` (the JSON Lines), ``DELETE /v1/recordings/{id}``.

Who sees what: the server's API key sees every recording; a client secret sees those of the call it
opened (while the secret lives); anyone else's recording answers 404, as a missing one does, so
that an id says nothing about another caller. A server without an API key answers only clients on
its own host (as ``/duplex/stats?detail=1`` does): recordings hold what callers said, and an open
port must not hand them out. The store is the server's (``server/recording_store.py``), passed in
by the composition root through ``RecordingStore``: the edge reads no server code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from duplex.edge.http.auth import OPEN, RECORDINGS_PATH, Access, Credential, owner_of
from duplex.edge.http.stats_view import is_loopback

# a recording's id is its file stem: letters, digits, _ . - (recording names are made so) and
# never a leading dot, so no id can name a path outside the folder or a hidden file
_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}")


class RecordingInfo(msgspec.Struct, kw_only=True):
    id: str
    call_id: str
    owner: str | None  # owner_of(the opener's credential); None: the server's own (a phone call)
    created_at: float  # epoch seconds
    duration_s: float
    bytes: int  # the WAV's size
    object: str = "duplex.recording"


class RecordingStore(Protocol):
    def recordings(self) -> list[RecordingInfo]: ...
    def find(self, recording_id: str) -> RecordingInfo | None: ...
    def wav(self, recording_id: str) -> Path: ...
    def events(self, recording_id: str) -> Path: ...
    def delete(self, recording_id: str) -> None: ...


def _error(status: int, code: str, message: str) -> JSONResponse:
    kind = {403: "permission_error", 404: "not_found", 400: "invalid_request_error"}[status]
    return JSONResponse({"error": {"type": kind, "code": code, "message": message}}, status_code=status)


def add_recording_routes(app: FastAPI, store: RecordingStore, access: Access) -> None:
    def refusal(request: Request) -> Response | None:
        """A server with no key lends its recordings only to its own host."""
        client = request.client.host if request.client else None
        if not access.enabled and not (client is not None and is_loopback(client)):
            return _error(403, "recordings_local_only", "this server has no API key: its recordings are served "
                                                        "only to clients on its own host (start it with --api-key)")
        return None

    def sees(credential: Credential, info: RecordingInfo) -> bool:
        return credential.kind in ("key", "open") or info.owner == owner_of(credential)

    def own(request: Request, recording_id: str) -> RecordingInfo | Response:
        """The caller's recording, or the refusal to send instead."""
        refused = refusal(request)
        if refused is not None:
            return refused
        if not _ID.fullmatch(recording_id):
            return _error(400, "invalid_recording_id", "a recording id is letters, digits, _ . - "
                                                       "(as GET /v1/recordings lists them)")
        info = store.find(recording_id)
        if info is None or not sees(_credential(request), info):  # another's answers as a missing one
            return _error(404, "recording_not_found", f"no recording {recording_id!r}")
        return info

    @app.get(RECORDINGS_PATH)
    async def list_recordings(request: Request) -> Response:
        refused = refusal(request)
        if refused is not None:
            return refused
        credential = _credential(request)
        data = [r for r in store.recordings() if sees(credential, r)]
        return Response(msgspec.json.encode({"object": "list", "data": data}), media_type="application/json")

    @app.get(RECORDINGS_PATH + "/{recording_id}")
    async def get_recording(recording_id: str, request: Request) -> Response:
        info = own(request, recording_id)
        if isinstance(info, Response):
            return info
        return FileResponse(store.wav(info.id), media_type="audio/wav", filename=f"{info.id}.wav")

    @app.get(RECORDINGS_PATH + "/{recording_id}/events")
    async def get_events(recording_id: str, request: Request) -> Response:
        info = own(request, recording_id)
        if isinstance(info, Response):
            return info
        return FileResponse(store.events(info.id), media_type="application/jsonl", filename=f"{info.id}.jsonl")

    @app.delete(RECORDINGS_PATH + "/{recording_id}")
    async def delete_recording(recording_id: str, request: Request) -> Response:
        info = own(request, recording_id)
        if isinstance(info, Response):
            return info
        store.delete(info.id)
        return Response(status_code=204)


def _credential(request: Request) -> Credential:
    return getattr(request.state, "credential", OPEN)

"""Reading a Realtime call request: an SDP offer as ``application/sdp``, or multipart form
fields ``sdp`` and optional ``session`` (JSON), within a size limit."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

import msgspec
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from duplex.session.realtime.events import SessionSettings

MAX_BODY_BYTES = 64 * 1024


class SignallingError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CallRequest:
    sdp: str
    settings: SessionSettings | None


async def read_call_request(request: Request) -> CallRequest:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await _read_limited(request)
    if content_type == "application/sdp":  # (as the Realtime API: text/plain is another type, 415)
        return CallRequest(_text(body, "body"), None)
    if content_type == "multipart/form-data":
        return await _read_multipart(request, body)
    raise SignallingError(415, f"unsupported content type {content_type or '(none)'!r}: send the SDP offer as "
                               "application/sdp, or multipart/form-data with fields 'sdp' and 'session'")


async def _read_limited(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise SignallingError(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise SignallingError(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
    return bytes(body)


async def _read_multipart(request: Request, body: bytes) -> CallRequest:
    async def replay() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await MultiPartParser(request.headers, replay(), max_files=2, max_fields=8,
                                     max_part_size=MAX_BODY_BYTES).parse()
    except MultiPartException as exc:
        raise SignallingError(400, f"malformed multipart body: {exc.message}") from None
    sdp = await _field(form.get("sdp"), "sdp")
    if sdp is None:
        raise SignallingError(400, "multipart body has no 'sdp' field")
    raw_session = await _field(form.get("session"), "session")
    settings = None
    if raw_session:
        try:
            settings = msgspec.json.decode(raw_session, type=SessionSettings)
        except msgspec.DecodeError as exc:
            raise SignallingError(400, f"'session' field: {exc}") from None
    return CallRequest(sdp, settings)


async def _field(value: str | UploadFile | None, name: str) -> str | None:
    if isinstance(value, UploadFile):
        return _text(await value.read(), name)
    return value


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SignallingError(400, f"{name} is not UTF-8 text") from None

"""Access control: an API key on every endpoint but the demo page's files, short-lived client
secrets for browsers, and calls that only their opener can inspect or hang up.

- With no API key configured (``--api-key`` / ``DUPLEX_API_KEY``) everything is open, as it
  always was; the server binds 127.0.0.1 unless told otherwise.
- With a key, every request needs ``Authorization: Bearer <key>``, except the demo page
  (``/``, ``/web/...``). A browser opening a WebSocket cannot set headers: it may pass the key
  as the subprotocol ``openai-insecure-api-key.<key>`` (the OpenAI convention).
- ``POST /v1/realtime/client_secrets`` (key only) mints a secret ``ek_...``: it opens ONE call
  (WebRTC offer or WebSocket) before it expires; afterwards it still identifies its own call, so
  the browser that opened it can hang it up, and nothing else.
- A call is inspected or hung up only with the credential that opened it (403 otherwise).
- Failed authentications are counted per client address: past ``max_failures`` a minute, 429.

The middleware is plain ASGI, so it covers HTTP and WebSocket routes alike, present and future.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from duplex.edge.config import AccessConfig
from duplex.session.realtime.events import SessionSettings

SECRET_PREFIX = "ek_"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
FAILURE_WINDOW_S = 60.0
SECRETS_PATH = "/v1/realtime/client_secrets"
DEMO_SECRET_PATH = "/duplex/demo/client_secret"
_OPENERS = {("POST", "/v1/realtime/calls"), ("WS", "/v1/realtime")}  # a client secret opens these
_OWN_CALL_PREFIX = "/v1/realtime/calls/"  # ... and then reaches its own call here
RECORDINGS_PATH = "/v1/recordings"  # ... and its call's recordings (recordings.py)
_PUBLIC = ("/web/",)


class AuthError(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after = status, code, retry_after

    def body(self) -> bytes:
        kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
            self.status, "invalid_request_error")
        return msgspec.json.encode({"error": {"type": kind, "code": self.code, "message": str(self)}})


@dataclass(frozen=True)
class Credential:
    """Who made a request: ``key``, one client secret, or anyone (no key configured)."""

    kind: str  # "key" | "secret" | "open"
    id: str  # what a call's owner is recorded as
    settings: SessionSettings | None = None  # a secret's session settings


OPEN = Credential("open", "open")
KEY = Credential("key", "key")


def owner_of(credential: Credential) -> str:
    """The identity a call's recording keeps of who opened it: a hash, so that the secret itself
    never lies on disk next to the recording (a client secret's 24 random bytes need no salt)."""
    return hashlib.sha256(credential.id.encode()).hexdigest()[:32]


@dataclass
class ClientSecret:
    value: str
    expires_at: float  # wall clock (epoch seconds)
    settings: SessionSettings | None = None
    call_id: str | None = None  # the call it opened (it opens no other)
    used: bool = False


@dataclass
class Access:
    config: AccessConfig
    clock: Callable[[], float] = time.time
    _secrets: dict[str, ClientSecret] = field(default_factory=dict)
    _owners: dict[str, str] = field(default_factory=dict)  # call id -> credential id
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: {"minted": 0, "refused": 0, "rate_limited": 0})

    @property
    def enabled(self) -> bool:
        return self.config.api_key is not None

    # -- client secrets -------------------------------------------------------------------------
    def mint(self, ttl_s: float | None = None, settings: SessionSettings | None = None) -> ClientSecret:
        now = self.clock()
        # a spent secret is kept until it expires, so a second use is told it was used
        self._secrets = {v: s for v, s in self._secrets.items() if s.call_id is not None or s.expires_at > now}
        if sum(not s.used for s in self._secrets.values()) >= self.config.max_secrets:
            self.counters["rate_limited"] += 1
            raise AuthError(429, "too_many_client_secrets", f"{self.config.max_secrets} client secrets are "
                                                            "outstanding; use or let some expire first", 10)
        secret = ClientSecret(SECRET_PREFIX + secrets.token_urlsafe(24), now + (ttl_s or self.config.secret_ttl_s),
                              settings)
        self._secrets[secret.value] = secret
        self.counters["minted"] += 1
        return secret

    # -- who is asking --------------------------------------------------------------------------
    def authenticate(self, token: str | None, client: str, opens_call: bool) -> Credential:
        """The credential behind ``token``; ``opens_call``: the request opens a call (a client
        secret is spent on it). Raises AuthError."""
        if not self.enabled:
            return OPEN
        self._check_failures(client)
        try:
            return self._credential(token, opens_call)
        except AuthError:
            self.counters["refused"] += 1
            self._failures.setdefault(client, deque()).append(self.clock())
            raise

    def _credential(self, token: str | None, opens_call: bool) -> Credential:
        if not token:
            raise AuthError(401, "missing_api_key", "this server needs an API key: Authorization: Bearer <key>")
        assert self.config.api_key is not None
        if hmac.compare_digest(token.encode(), self.config.api_key.encode()):
            return KEY
        secret = self._secrets.get(token) if token.startswith(SECRET_PREFIX) else None
        if secret is None:
            raise AuthError(401, "invalid_api_key", "the API key or client secret is not valid")
        expired = secret.expires_at <= self.clock()
        if opens_call or secret.call_id is None:  # past its call, a secret is as good as its expiry
            if opens_call and secret.used:
                raise AuthError(401, "client_secret_used", "this client secret already opened a call; mint another")
            if expired:
                raise AuthError(401, "client_secret_expired", "this client secret has expired; mint another")
            secret.used = secret.used or opens_call
        return Credential("secret", "secret:" + secret.value, secret.settings)

    def _check_failures(self, client: str) -> None:
        window = self._failures.get(client)
        if window is None:
            return
        now = self.clock()
        while window and window[0] <= now - FAILURE_WINDOW_S:
            window.popleft()
        if not window:
            del self._failures[client]
        elif len(window) >= self.config.max_failures:
            self.counters["rate_limited"] += 1
            raise AuthError(429, "too_many_failed_attempts", f"{len(window)} failed authentications from this "
                                                              "address in the last minute; wait",
                            round(window[0] + FAILURE_WINDOW_S - now) + 1)

    # -- calls and their owners -----------------------------------------------------------------
    def opened(self, call_id: str, credential: Credential, live: Callable[[str], bool]) -> None:
        """``credential`` opened ``call_id``; ``live`` tells which recorded calls still exist."""
        for old in [c for c in self._owners if not live(c)]:
            self.forget(old)
        self._owners[call_id] = credential.id
        if credential.kind == "secret":
            self._secrets[credential.id.removeprefix("secret:")].call_id = call_id

    def release(self, credential: Credential) -> None:
        """The call ``credential`` came to open was refused (rate limit, server full, bad offer):
        a client secret spent on it may open a call again, so a Retry-After can be kept."""
        if credential.kind != "secret":
            return
        secret = self._secrets.get(credential.id.removeprefix("secret:"))
        if secret is not None and secret.call_id is None:
            secret.used = False

    def check_owner(self, call_id: str, credential: Credential) -> None:
        """Raises AuthError 403 unless ``credential`` opened the call (a call nobody recorded
        answers as not found, to its caller)."""
        owner = self._owners.get(call_id)
        if owner is not None and owner != credential.id:
            raise AuthError(403, "not_call_owner", "this call was opened with another credential")

    def forget(self, call_id: str) -> None:
        owner = self._owners.pop(call_id, None)
        secret = self._secrets.get(owner.removeprefix("secret:")) if owner and owner.startswith("secret:") else None
        if secret is not None:
            secret.call_id = None  # spent; dropped once it expires

    def stats(self) -> dict:
        return {"enabled": self.enabled, "secrets": len(self._secrets), "owned_calls": len(self._owners),
                **self.counters}


# -- the ASGI middleware ----------------------------------------------------------------------------
Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class AccessMiddleware:
    """Checks every request but the demo page's; puts the credential in ``scope['state']``."""

    def __init__(self, app: Callable, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _public(scope["path"]):
            await self.app(scope, receive, send)
            return
        method = "WS" if scope["type"] == "websocket" else scope["method"]
        client = scope.get("client")
        address = client[0] if client else "unknown"
        token, protocols = _token(scope)
        opens = (method, scope["path"].rstrip("/")) in _OPENERS
        try:
            credential = self.access.authenticate(token, address, opens)
            if credential.kind == "secret" and not (opens or scope["path"].startswith(_OWN_CALL_PREFIX)
                                                    or _under(scope["path"], RECORDINGS_PATH)):
                raise AuthError(403, "client_secret_not_allowed", "a client secret opens a call and reaches only "
                                                                  "that call and its recordings; this endpoint "
                                                                  "needs the API key")
        except AuthError as exc:
            await deny(scope, receive, send, exc)
            return
        scope.setdefault("state", {})["credential"] = credential
        if protocols is not None:  # the key rode in a subprotocol: offer the client only its others
            scope["subprotocols"] = protocols
        await self.app(scope, receive, send)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def _public(path: str) -> bool:
    # /healthz and /readyz: load balancers probe them without keys (/metrics stays behind the key)
    return path in ("/", "/healthz", "/readyz") or path.startswith(_PUBLIC) or path == DEMO_SECRET_PATH


def _token(scope: Scope) -> tuple[str | None, list[str] | None]:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), None
    protocols = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    for protocol in protocols:
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL):], [p for p in protocols if p != protocol]
    return None, None


async def deny(scope: Scope, receive: Receive, send: Send, error: AuthError) -> None:
    """Refuse a request (HTTP) or a WebSocket before it is accepted, with the error as JSON."""
    headers = [(b"content-type", b"application/json")]
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="duplex"'))
    if error.retry_after is not None:
        headers.append((b"retry-after", str(error.retry_after).encode()))
    if error.status in (408, 413):  # the rest of the body may never come: the connection goes too
        headers.append((b"connection", b"close"))
    body = error.body()
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": error.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # the server cannot send a denial response: a plain refusal (HTTP 403)
        await send({"type": "websocket.close", "code": 1008})

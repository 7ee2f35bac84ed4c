"""The HTTP door's first check, before authentication and before any route: the Host a request
names, the Origin a browser sends, and a body that arrives whole, in time and within its size.

- Host: IP literals and localhost names are always served (no DNS name, nothing to rebind), plus
  the bound host when it is a name and ``EdgeConfig.allowed_hosts`` (``*`` any, ``*.example.org``
  a domain's names). A web page whose name an attacker re-points at this server (DNS rebinding)
  sends its own name as Host and is refused 421.
- Origin (sent by browsers on cross-origin requests and on every WebSocket): same origin as the
  Host, or one of ``EdgeConfig.allowed_origins``; otherwise 403. This is what stops a foreign page
  from POSTing an offer as ``text/plain`` (a "simple" request: no preflight) or opening the
  WebSocket. Preflights of allowed origins go on to CORS (``app.py``), so CORS stays explicit.
- Bodies are read here, whole, under ``HttpLimits.body_timeout_s`` (408) and ``max_body_bytes``
  (413), then replayed to the app: a body shorter than its Content-Length holds nothing for long.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from duplex.edge.config import EdgeConfig
from duplex.edge.http.auth import AuthError, deny

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
_LOCAL_NAMES = ("localhost", "localhost.localdomain")
REFUSED = {"host": 0, "origin": 0, "body_timeout": 0, "body_too_large": 0}  # for /duplex/stats


def _split_host(value: str) -> tuple[str, str]:
    """``host[:port]`` (or ``[v6]:port``) -> (lower-case host, port text)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest.removeprefix(":")
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class HostPolicy:
    def __init__(self, config: EdgeConfig) -> None:
        self.hosts = {h.lower() for h in config.allowed_hosts}
        if not _is_ip(config.host):
            self.hosts.add(config.host.lower())
        self.origins = {o.lower().rstrip("/") for o in config.allowed_origins}

    def host_allowed(self, host: str) -> bool:
        if "*" in self.hosts or _is_ip(host) or host in _LOCAL_NAMES or host.endswith(".localhost"):
            return True
        return host in self.hosts or any(p.startswith("*.") and host.endswith(p[1:]) for p in self.hosts)

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        origin = origin.lower().rstrip("/")
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc == host_header.lower()


class DoorGuard:
    """ASGI middleware, outermost: Host, Origin, then the body (HTTP only)."""

    def __init__(self, app: Callable, config: EdgeConfig) -> None:
        self.app = app
        self.policy = HostPolicy(config)
        self.limits = config.http
        self.refused = REFUSED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._check_names(headers)
        if refusal is None and scope["type"] == "http":
            replay, refusal = await self._read_body(headers, receive)
            if replay is None:
                return  # the client went away while sending its body
            receive = replay
        if refusal is not None:
            await deny(scope, receive, send, refusal)
            return
        await self.app(scope, receive, send)

    def _check_names(self, headers: dict[str, str]) -> AuthError | None:
        host_header = headers.get("host", "")
        host, _ = _split_host(host_header)
        if host_header and not self.policy.host_allowed(host):
            self.refused["host"] += 1
            return AuthError(421, "host_not_allowed", f"this server does not answer to the host name {host!r}; "
                                                      "an operator allows names with --allowed-host")
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin, host_header):
            self.refused["origin"] += 1
            return AuthError(403, "origin_not_allowed", f"requests from web pages of origin {origin[:100]!r} are "
                                                        "not allowed here; an operator allows origins with "
                                                        "--allowed-origin")
        return None

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> tuple[Receive | None, AuthError | None]:
        """(the receive the app gets, a refusal or None); the receive is None if the client left."""
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            self.refused["body_too_large"] += 1
            return receive, AuthError(413, "body_too_large", f"request body of {declared} bytes; the limit is {limit}")
        body = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None, None
                    body += message.get("body", b"")
                    if len(body) > limit:
                        self.refused["body_too_large"] += 1
                        return receive, AuthError(413, "body_too_large", f"request body over {limit} bytes")
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            self.refused["body_timeout"] += 1
            return receive, AuthError(408, "body_timeout", f"the request body did not arrive within "
                                                           f"{self.limits.body_timeout_s:g} s ({len(body)} bytes came)")
        return _replay(bytes(body), receive), None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then whatever comes: the disconnect

    return replayed

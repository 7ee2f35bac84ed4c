"""What ``GET /duplex/stats`` shows whom: counts for everyone; caller identifiers (session and
request ids, SIP Call-IDs, addresses, process ids) only with ``?detail=1`` and the API key, or,
on a server without a key, to a client on the same host (the operator's own tools).

Redaction is by shape, so a door's stats need no rules of their own: fields named like
identifiers are dropped, and the entries of maps keyed by identifiers (live sessions, SIP calls)
are renumbered 1, 2, ... with their counters kept."""

from __future__ import annotations

from typing import Any

from duplex.edge.http.auth import Credential
from duplex.edge.rate import is_loopback

# fields that name a caller, a call or a process
_IDENTIFYING = frozenset({
    "pid", "pids", "request_id", "request_ids", "session_id", "call_id", "call_ids", "id", "ids",
    "address", "addr", "remote", "remote_address", "source", "client", "ip", "host", "port",
    "from", "to", "uri", "contact", "caller", "callee", "number", "stream_sid", "call_sid", "tag",
    "local_tag", "remote_tag", "user", "username",
})
# maps whose keys are identifiers (session ids, SIP Call-IDs, connection ids)
_ID_KEYED = frozenset({"sessions", "active", "calls", "connections", "streams"})


def detail_allowed(wanted: bool, credential: Credential, key_configured: bool, client_host: str | None) -> bool:
    if not wanted:
        return False
    if key_configured:
        return credential.kind == "key"
    return client_host is not None and is_loopback(client_host)


def _identifies(key: str, value: Any) -> bool:
    """An identifier field: a process id, or an id-named field holding text (a count under such a
    name, like a rate limiter's ``refused: {"source": 3}``, is kept)."""
    if key in ("pid", "pids", "port"):
        return True
    return key in _IDENTIFYING and not (isinstance(value, int) and not isinstance(value, bool))


def redact(value: Any, parent: str = "") -> Any:
    if isinstance(value, dict):
        if parent in _ID_KEYED and value and all(isinstance(v, dict) for v in value.values()):
            return {str(i): redact(v) for i, v in enumerate(value.values(), 1)}
        return {k: redact(v, k) for k, v in value.items() if not _identifies(str(k).lower(), v)}
    if isinstance(value, list | tuple):
        return [redact(v, parent) for v in value]
    return value

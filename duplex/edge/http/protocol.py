"""uvicorn's HTTP/1.1 protocol with what a server facing strangers needs and uvicorn lacks:

- a header deadline: a connection must finish a request's headers within ``header_timeout_s`` of
  opening (or of its last response), else it gets 408 and is closed; uvicorn itself waits forever
  for a first request, and for the rest of one that has started;
- a cap on open connections, applied at accept: past ``max_connections`` (HTTP and WebSocket;
  at most half the process's file descriptors), or ``max_connections_per_source`` from one
  address, a new connection gets 503 and is closed at once, so idle sockets cannot use up the
  descriptors (uvicorn's ``limit_concurrency``, set to the same number, answers 503 only once a
  request has been read);
- ``BoundedLog``: a logging filter that lets each distinct message through at most N times a
  minute (asyncio logs every failed ``accept()`` when descriptors run out; uvicorn every invalid
  request), with a count of what it held back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from duplex.edge.config import HttpLimits

COUNTERS = {"header_timeouts": 0, "closed_at_accept": 0}  # for /duplex/stats (one server per process)


def _raw_response(status: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"type": "invalid_request_error", "code": code, "message": message}}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def connection_cap(configured: int) -> int:
    """``configured``, or half the process's file descriptors if that is less: the rest are for
    calls' media sockets, stage channels and shared memory, so a flood meets the cap before EMFILE."""
    soft = _descriptors()
    return configured if soft is None else max(8, min(configured, soft // 2))


def accept_backlog(cap: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go before
    any of them is looked at: small enough that a burst is turned away before it uses up the
    descriptors the cap leaves free. Half the cap, and at most a quarter of the descriptors the
    cap leaves over: asyncio sets a connection up and closes a refused one on later turns of its
    loop, so about three batches are open at once (1,000 idle sockets at a server allowed 256
    descriptors, cap 128: peak 240 with a backlog of 64, 131 with 32). A smaller backlog than
    half the cap makes a burst of callers wait for SYN retries (1 s each)."""
    soft = _descriptors()
    left_over = 4 * 2048 if soft is None else max(0, soft - cap)
    return max(16, min(2048, cap // 2, left_over // 4))


def _descriptors() -> int | None:
    """The process's file descriptor limit (soft); None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def guarded_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    cap = connection_cap(limits.max_connections)

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            refusal = self._over_cap()
            if refusal is not None:
                COUNTERS["closed_at_accept"] += 1
                transport.write(_raw_response("503 Service Unavailable", "too_many_connections", refusal))
                transport.close()
                return
            self._arm()

        def _over_cap(self) -> str | None:
            # connections turned away a moment ago stay in the set until their close runs: not counted
            open_now = [c for c in self.connections if not _closing(c)]
            if len(open_now) > cap:
                return f"the server holds {cap} connections; try later"
            source = self.client[0] if self.client else None
            if source is not None:
                clients = (getattr(c, "client", None) for c in open_now)  # any uvicorn protocol's peer
                mine = sum(1 for client in clients if client and client[0] == source)
                if mine > limits.max_connections_per_source:
                    return f"{limits.max_connections_per_source} connections from this address are open already"
            return None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # the headers are in (the body has its own deadline: edge/guard.py)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request's headers, on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            COUNTERS["header_timeouts"] += 1
            self.transport.write(_raw_response("408 Request Timeout", "header_timeout",
                                               f"no complete request headers within {limits.header_timeout_s:g} s"))
            self.transport.close()

    return GuardedH11Protocol


def _closing(connection: object) -> bool:
    transport = getattr(connection, "transport", None)
    return transport is None or transport.is_closing()


class BoundedLog(logging.Filter):
    """At most ``per_window`` records of each message (its format string) per ``window_s``; the
    first one let through after a quiet spell says how many were held back."""

    def __init__(self, per_window: int, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_messages: int = 256) -> None:
        super().__init__()
        self.per_window, self.window_s, self.clock = per_window, window_s, clock
        self.max_messages = max_messages
        self._seen: dict[str, list[float]] = {}  # message -> [window start, count, held back]
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = self.clock()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.window_s:
            held = int(entry[2]) if entry is not None else 0
            if entry is None and len(self._seen) >= self.max_messages:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = [now, 1, 0]
            if held:
                record.msg = f"{record.msg} [{held} more like this in the last {self.window_s:g} s not logged]"
            return True
        entry[1] += 1
        if entry[1] <= self.per_window:
            return True
        entry[2] += 1
        self.suppressed += 1
        return False


def bound_server_logs(per_minute: int) -> BoundedLog:
    """Install one ``BoundedLog`` on the loggers a flood of connections fills (idempotent)."""
    for name in ("asyncio", "uvicorn.error"):
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, BoundedLog)]:
            logger.removeFilter(old)
    bounded = BoundedLog(per_minute)
    for name in ("asyncio", "uvicorn.error"):
        logging.getLogger(name).addFilter(bounded)
    return bounded

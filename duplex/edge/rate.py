"""Admission limits on new calls, one mechanism for every door: a token bucket per source and one
for the whole door (``CallRate``), and a cap on the calls one source holds that are not yet
connected (``PendingCalls``: an answered WebRTC offer before ICE, a WebSocket before its first
event, a Twilio stream before its ``start``, a SIP INVITE before its ACK). A refusal says how long
to wait (``Retry-After``). A source is an address; an IPv6 address counts as its /64, the block
one host is given (``source_of``).

Sources are held in a bounded table (least recently seen dropped first), so a flood from many
addresses costs memory in proportion to the table, not to the flood.

One rule at every door (WebRTC, WebSocket, SIP, Twilio): a loopback source (127.0.0.0/8, ::1)
is not rate-limited unless the door's ``limit_loopback`` is set (``--limit-loopback``): the
host's own tools and a reverse proxy or SBC on the host share one address for every caller.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


def is_loopback(host: str) -> bool:
    """127.0.0.0/8 or ::1, also as an IPv4-mapped IPv6 address (a dual-stack socket's view of
    127.0.0.1, which Python before 3.13 does not call loopback); a host name is not."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def exempt(host: str, limit_loopback: bool) -> bool:
    """Whether a new call from ``host`` passes its door's rate unchecked (the rule above)."""
    return not limit_loopback and is_loopback(host)


class RateConfig(BaseModel):
    """New calls a door takes: ``per_source`` a minute from one address (``source_burst`` at
    once), ``total`` a minute from everyone (``total_burst`` at once)."""

    model_config = ConfigDict(extra="forbid")

    per_source: float = Field(30.0, gt=0)
    source_burst: int = Field(10, ge=1)
    total: float = Field(600.0, gt=0)
    total_burst: int = Field(60, ge=1)
    max_sources: int = Field(10000, ge=16)  # source addresses remembered at once
    # calls one source may hold before they connect, as a share of the server's sessions (at least
    # one): half-open calls from one address cannot fill the server
    pending_share: float = Field(0.25, gt=0, le=1)

    def pending_cap(self, max_sessions: int) -> int:
        return max(1, math.floor(max_sessions * self.pending_share))


def source_of(address: str) -> str:
    """The source a limit counts: the address, or for IPv6 its /64 (one host's usual block, so
    an attacker cannot take a fresh address per call)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Bucket:
    tokens: float
    stamp: float

    def take(self, now: float, per_s: float, burst: int) -> float:
        """Take one token; 0.0 if taken, else the seconds until one is there."""
        self.tokens = min(float(burst), self.tokens + (now - self.stamp) * per_s)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / per_s


class RateLimited(Exception):
    """``pending``: refused for the source's calls not yet connected, not for its rate."""

    def __init__(self, message: str, retry_after_s: float, pending: bool = False) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.pending = pending

    @property
    def retry_after(self) -> int:
        """Whole seconds for a ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(self.retry_after_s))


class CallRate:
    """``check(source)`` before any costly work of a new call; raises ``RateLimited``."""

    def __init__(self, config: RateConfig, door: str, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int | None = None) -> None:
        self.config = config
        self.door = door
        self.clock = clock
        # one address's burst never exceeds the server's sessions unless set so on purpose
        explicit = "source_burst" in config.model_fields_set or max_sessions is None
        self.source_burst = config.source_burst if explicit else min(config.source_burst, max_sessions or 1)
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._total = _Bucket(float(config.total_burst), clock())
        self.refused = {"source": 0, "total": 0}

    def check(self, address: str) -> None:
        source = source_of(address)
        now = self.clock()
        cfg = self.config
        bucket = self._sources.pop(source, None) or _Bucket(float(self.source_burst), now)
        self._sources[source] = bucket  # most recently seen last
        while len(self._sources) > cfg.max_sources:
            self._sources.popitem(last=False)
        wait = bucket.take(now, cfg.per_source / 60.0, self.source_burst)
        if wait:
            self.refused["source"] += 1
            raise RateLimited(f"too many new {self.door} calls from this address "
                              f"(limit {cfg.per_source:g} a minute); try again later", wait)
        wait = self._total.take(now, cfg.total / 60.0, cfg.total_burst)
        if wait:
            bucket.tokens = min(float(self.source_burst), bucket.tokens + 1.0)  # not this source's fault
            self.refused["total"] += 1
            raise RateLimited(f"too many new {self.door} calls (limit {cfg.total:g} a minute for the "
                              f"server); try again later", wait)

    def stats(self) -> dict:
        return {"sources": len(self._sources), "refused": dict(self.refused)}


class Pending:
    """One admitted call that has not connected yet; ``release`` when it connects or ends (once
    counts: a second release does nothing)."""

    def __init__(self, owner: PendingCalls | None, source: str) -> None:
        self._owner, self.source = owner, source

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release(self.source)


UNCOUNTED = Pending(None, "")  # a call no cap counts (an exempt source)


class PendingCalls:
    """``admit(address)`` before any costly work of a new call: refuses (``RateLimited``) a source
    that already holds ``cap`` calls not yet connected. ``retry_after_s`` is when the oldest of them
    is dropped at the latest (the door's connect deadline)."""

    def __init__(self, cap: int, door: str, retry_after_s: float) -> None:
        self.cap, self.door, self.retry_after_s = cap, door, retry_after_s
        self._held: dict[str, int] = {}
        self.refused = 0

    def admit(self, address: str) -> Pending:
        source = source_of(address)
        held = self._held.get(source, 0)
        if held >= self.cap:
            self.refused += 1
            raise RateLimited(f"this address already has {held} {self.door} calls that have not connected "
                              f"(at most {self.cap}); try again when they have", self.retry_after_s, pending=True)
        self._held[source] = held + 1
        return Pending(self, source)

    def _release(self, source: str) -> None:
        left = self._held.get(source, 0) - 1
        if left > 0:
            self._held[source] = left
        else:
            self._held.pop(source, None)

    def held(self, address: str) -> int:
        return self._held.get(source_of(address), 0)

    def stats(self) -> dict:
        return {"cap": self.cap, "pending": sum(self._held.values()), "sources": len(self._held),
                "refused": self.refused}


class DoorAdmission:
    """A door's rules for a new call from ``address``, before any costly work: a loopback source
    passes unless ``limit_loopback`` (the host's own tools, a local proxy); otherwise the source's
    calls not yet connected are capped, then the rate buckets are asked. ``admit`` returns the
    call's ``Pending`` (release it when the call connects or ends) or raises ``RateLimited``."""

    def __init__(self, config: RateConfig, door: str, max_sessions: int, connect_deadline_s: float,
                 limit_loopback: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_loopback = limit_loopback
        self.rate = CallRate(config, door, clock, max_sessions)
        self.pending = PendingCalls(config.pending_cap(max_sessions), door, connect_deadline_s)

    def admit(self, address: str) -> Pending:
        if exempt(address, self.limit_loopback):
            return UNCOUNTED
        pending = self.pending.admit(address)  # first: a refusal here spends no rate token
        try:
            self.rate.check(address)
        except RateLimited:
            pending.release()
            raise
        return pending

    def stats(self) -> dict:
        return {**self.rate.stats(), "pending": self.pending.stats()}

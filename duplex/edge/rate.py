"""Rate limits on new calls, one mechanism for every door: a token bucket per source address
and one for the whole door. A refusal says how long to wait (``Retry-After``).

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
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> int:
        """Whole seconds for a ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(self.retry_after_s))


class CallRate:
    """``check(source)`` before any costly work of a new call; raises ``RateLimited``."""

    def __init__(self, config: RateConfig, door: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.door = door
        self.clock = clock
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._total = _Bucket(float(config.total_burst), clock())
        self.refused = {"source": 0, "total": 0}

    def check(self, source: str) -> None:
        now = self.clock()
        cfg = self.config
        bucket = self._sources.pop(source, None) or _Bucket(float(cfg.source_burst), now)
        self._sources[source] = bucket  # most recently seen last
        while len(self._sources) > cfg.max_sources:
            self._sources.popitem(last=False)
        wait = bucket.take(now, cfg.per_source / 60.0, cfg.source_burst)
        if wait:
            self.refused["source"] += 1
            raise RateLimited(f"too many new {self.door} calls from this address "
                              f"(limit {cfg.per_source:g} a minute); try again later", wait)
        wait = self._total.take(now, cfg.total / 60.0, cfg.total_burst)
        if wait:
            bucket.tokens = min(float(cfg.source_burst), bucket.tokens + 1.0)  # not this source's fault
            self.refused["total"] += 1
            raise RateLimited(f"too many new {self.door} calls (limit {cfg.total:g} a minute for the "
                              f"server); try again later", wait)

    def stats(self) -> dict:
        return {"sources": len(self._sources), "refused": dict(self.refused)}

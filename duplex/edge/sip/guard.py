"""What keeps a SIP flood from costing callers their line (issue 15): the per-source and
global rate of new INVITEs (the shared ``CallRate``), and the reply budget that stops the
server from amplifying (``ReplyBudget``), with the one exemption that is safe: a source that
ACKed our 200 OK (it saw our To tag, so it is not a spoofed address) and configured trunks.
"""

from __future__ import annotations

import collections
import ipaddress
import logging

from duplex.edge.phone.refusals import Refusals
from duplex.edge.rate import CallRate, RateConfig, RateLimited, exempt
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.reply_budget import ReplyBudget
from duplex.edge.sip.transactions import Address

log = logging.getLogger(__name__)


class SipGuard:
    def __init__(self, config: SipConfig, counters: collections.Counter[str]) -> None:
        self.rate = CallRate(config.rate, "sip", max_sessions=config.max_calls)
        self.limit_loopback = config.limit_loopback
        # how often a refused source hears why: a flood past its rate is mostly dropped unanswered
        self.refusal_replies = CallRate(RateConfig(
            per_source=config.refusal_replies, source_burst=2, total=60 * config.refusal_replies,
            total_burst=100, max_sources=config.rate.max_sources), "sip refusal replies")
        self.budget = ReplyBudget(config.reply_window_s, config.reply_allowance_bytes,
                                  config.rate.max_sources)
        self.refusals = Refusals(counters, log, "sip")
        self._exempt = [ipaddress.ip_network(cidr, strict=False) for cidr in config.budget_exempt]
        self._trusted: collections.Counter[str] = collections.Counter()  # host -> confirmed calls

    def received(self, host: str, size: int) -> None:
        self.budget.received(host, size)

    def may_send(self, addr: Address, size: int) -> bool:
        host = addr[0]
        if self._trusted[host] > 0 or self._exempted(host):
            return True
        if self.budget.spend(host, size):
            return True
        self.refusals.note("replies_over_budget", f"{size} bytes to {host} not sent")
        return False

    def fits(self, host: str, size: int) -> bool:
        """Would ``size`` more bytes to ``host`` go out now (without spending them)?"""
        return (self._trusted[host] > 0 or self._exempted(host)
                or self.budget.available(host) >= size)

    def check_rate(self, host: str) -> tuple[RateLimited | None, bool]:
        """(the refusal or None, whether to answer it); loopback passes unless ``limit_loopback``."""
        if exempt(host, self.limit_loopback):
            return None, False
        try:
            self.rate.check(host)
        except RateLimited as exc:
            self.refusals.note("rate_limited", f"INVITE from {host}: {exc}")
            try:
                self.refusal_replies.check(host)
            except RateLimited:
                return exc, False
            return exc, True
        return None, False

    def trust(self, hosts: set[str]) -> None:
        for host in hosts:
            self._trusted[host] += 1

    def untrust(self, hosts: set[str]) -> None:
        for host in hosts:
            self._trusted[host] -= 1
            if self._trusted[host] <= 0:
                del self._trusted[host]

    def _exempted(self, host: str) -> bool:
        if not self._exempt:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._exempt)

    def stats(self) -> dict:
        return {"reply_budget": self.budget.stats(), "rate": self.rate.stats()["refused"]}

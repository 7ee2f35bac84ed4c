"""Pending calls: INVITEs being answered or answered 200 and not yet ACKed. They hold an RTP
port and a dialog entry but no session; there are at most ``max_pending_calls`` of them (the
oldest gives way to a new INVITE) and each lasts at most ``ack_timeout_s``. A real caller ACKs
within a round trip, so only calls that were never going to be real are dropped.

A dropped pending call gets one BYE (RFC 3261 §13.3.1.4 asks for one when the ACK never
comes), sent once, not retransmitted, and only within the source's reply budget: a flood from
spoofed addresses leaves no client transactions behind and gets nothing more back.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable

from duplex.edge.rate import exempt, source_of
from duplex.edge.sip.context import CallTable
from duplex.edge.sip.dialog import CallState, SipCall
from duplex.edge.sip.headers import parse_uri
from duplex.edge.sip.message import SipParseError
from duplex.edge.sip.transactions import Address

log = logging.getLogger(__name__)
PENDING = (CallState.EARLY, CallState.ANSWERED)


class PendingCalls:
    def __init__(self, calls: CallTable) -> None:
        self._calls = calls

    def _pending(self) -> list[SipCall]:
        return [call for call in self._calls.active.values() if call.state in PENDING]

    def count(self) -> int:
        return len(self._pending())

    def source_full(self, host: str) -> bool:
        """Does ``host``'s source already hold its share of the calls not yet ACKed (``rate.
        pending_share`` of ``max_calls``)? Then its next INVITE is refused, so one address can
        neither fill the table nor evict other callers' pending calls."""
        config = self._calls.server.config
        if exempt(host, config.limit_loopback):
            return False
        source = source_of(host)
        held = sum(source_of(call.peer[0]) == source for call in self._pending())
        return held >= config.rate.pending_cap(config.max_calls)

    def make_room(self) -> None:
        """Before a new call is answered: the oldest pending call goes if the table is full."""
        pending = self._pending()
        limit = self._calls.server.config.max_pending_calls
        for call in sorted(pending, key=lambda c: c.created)[:max(0, len(pending) - limit + 1)]:
            self._drop(call, "pending_evicted", "a newer INVITE needed its place")

    def ack_timed_out(self, call: SipCall) -> Callable[[], None]:
        return lambda: self._drop(call, "half_open_reaped", "its 200 OK was never ACKed")

    def _drop(self, call: SipCall, kind: str, reason: str) -> None:
        calls = self._calls
        if calls.active.get(call.call_id) is not call or call.state not in PENDING:
            return
        calls.server.guard.refusals.note(kind, f"call dropped: {reason}")
        if call.state is CallState.EARLY:
            calls.hang_up(call.call_id, reason)  # 480 to the INVITE
            return
        if call.ok_retransmitter is not None:
            call.ok_retransmitter.stop()
            call.ok_retransmitter = None
        host, port = calls.server.contact_address
        request, _ = call.build_request("BYE", host, port)
        calls.server.send_raw(request.serialize(), in_dialog_destination(call))
        calls.server.counters["byes_sent"] += 1
        calls.schedule_end(call, reason)


def in_dialog_destination(call: SipCall) -> Address:
    """The remote target (Contact) when it names an IP address, else where the INVITE came
    from (a Contact naming a host we cannot resolve here, or one behind NAT)."""
    try:
        uri = parse_uri(call.remote_target)
        ipaddress.ip_address(uri.host.strip("[]"))
    except (SipParseError, ValueError):
        return call.peer
    return uri.host.strip("[]"), uri.port or 5060

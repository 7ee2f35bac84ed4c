"""Responses to requests, and the dialog state of one call (RFC 3261 §8.2.6, §12)."""

from __future__ import annotations

import asyncio
import enum
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex.edge.phone.bridge import CallAgent, CallOpening
from duplex.edge.sip.headers import BRANCH_COOKIE, NameAddr, parse_name_addr
from duplex.edge.sip.media import CallMedia
from duplex.edge.sip.message import SipParseError, SipRequest, SipResponse
from duplex.edge.sip.sdp import LocalDescription, Negotiated
from duplex.edge.sip.transactions import Address, Retransmitter, ServerTransaction

REASONS = {
    100: "Trying", 180: "Ringing", 200: "OK", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 405: "Method Not Allowed", 415: "Unsupported Media Type",
    480: "Temporarily Unavailable", 482: "Loop Detected",
    481: "Call/Transaction Does Not Exist", 486: "Busy Here", 487: "Request Terminated",
    488: "Not Acceptable Here", 489: "Bad Event", 491: "Request Pending", 500: "Server Internal Error",
    501: "Not Implemented", 503: "Service Unavailable",
}
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY"  # NOTIFY: of our REFER's progress


def new_tag() -> str:
    return secrets.token_hex(6)


def new_branch() -> str:
    return BRANCH_COOKIE + secrets.token_hex(8)


def build_response(request: SipRequest, status: int, source: Address, *, to_tag: str = "",
                   reason: str = "", server: str = "duplex") -> SipResponse:
    """A response carrying the request's Via/From/To/Call-ID/CSeq (RFC 3261 §8.2.6.2)."""
    response = SipResponse(status=status, reason=reason or REASONS.get(status, "Unknown"))
    vias = request.get_all("Via")
    if vias:
        vias[0] = _stamp_received(vias[0], source)
    response.headers = [("Via", via) for via in vias]
    to = request.get("To") or ""
    if to_tag and status > 100 and not _has_tag(to):
        to = f"{to};tag={to_tag}"
    for name, value in (("From", request.get("From")), ("To", to),
                        ("Call-ID", request.get("Call-ID")), ("CSeq", request.get("CSeq"))):
        if value is not None:
            response.add(name, value)
    if server:
        response.add("Server", server)
    return response


def _has_tag(value: str) -> bool:
    try:
        return bool(parse_name_addr(value).tag)
    except SipParseError:
        return False


def _stamp_received(via: str, source: Address) -> str:
    """RFC 3261 §18.2.1 received=, RFC 3581 rport= : where the request really came from."""
    head, _, params = via.partition(";")
    names = [p.split("=")[0].strip().lower() for p in params.split(";")] if params else []
    out = [p for p in params.split(";") if p.strip().lower() != "rport"] if params else []
    if "rport" in names:
        out.append(f"rport={source[1]}")
    if "received" not in names:
        out.append(f"received={source[0]}")
    return ";".join([head, *[p for p in out if p]])


@dataclass
class Referral:
    """Our REFER of a call (``transfer``): where to, and its outcome once known."""

    target: str
    outcome: asyncio.Future  # of a TransferResult
    accepted: bool = False  # the far end said 202
    state: str = ""  # the last step told (accepted, trying, ringing, ok, failed)


class CallState(enum.Enum):
    EARLY = "early"  # INVITE received, final response not sent (pending: holds no session)
    ANSWERED = "answered"  # 200 OK sent, waiting for the ACK (pending: holds no session)
    CONFIRMED = "confirmed"
    ENDED = "ended"


@dataclass
class SipCall:
    call_id: str
    local_tag: str
    remote: NameAddr  # the caller (From)
    local: NameAddr  # us (To)
    remote_target: str  # the caller's Contact URI: where in-dialog requests go
    peer: Address  # signalling source address of the caller
    invite: SipRequest
    invite_txn: ServerTransaction
    description: LocalDescription
    remote_cseq: int
    route_set: list[str] = field(default_factory=list)
    local_cseq: int = 0
    state: CallState = CallState.EARLY
    agreed: Negotiated | None = None
    media: CallMedia | None = None
    agent: CallAgent | None = None
    answer_task: asyncio.Task | None = None
    ok_retransmitter: Retransmitter | None = None  # our 200 OK, until its ACK
    offer_in_ack: bool = False  # we offered in the 200 OK (INVITE without SDP)
    created: float = field(default_factory=time.monotonic)
    limit_timer: asyncio.TimerHandle | None = None  # the maximum call duration
    opening: CallOpening | None = None  # a call we placed: its own session settings, first line
    on_ended: Callable[[str], None] | None = None  # told the reason once the call is over
    on_event: Callable[[str, int | None, str], None] | None = None  # (kind, SIP status, detail): a placed call's log
    referral: Referral | None = None  # our REFER, while it is under way (``transfer``)

    @property
    def remote_tag(self) -> str:
        return self.remote.tag

    def matches(self, from_tag: str, to_tag: str) -> bool:
        """Is a request with these tags in this dialog? (the caller's tag is its From tag)"""
        return from_tag == self.remote_tag and to_tag == self.local_tag

    def build_request(self, method: str, via_host: str, via_port: int,
                      cseq: int | None = None) -> tuple[SipRequest, str]:
        """An in-dialog request from us (BYE, REFER; the 2xx ACK with its INVITE's ``cseq``):
        our tag on From, theirs on To (§12.2.1.1)."""
        if cseq is None:
            self.local_cseq += 1
        branch = new_branch()
        request = SipRequest(method=method, uri=self.remote_target)
        request.add("Via", f"SIP/2.0/UDP {via_host}:{via_port};branch={branch};rport")
        request.add("Max-Forwards", "70")
        for route in self.route_set:
            request.add("Route", route)
        request.add("From", _name_addr(self.local, self.local_tag))
        request.add("To", _name_addr(self.remote, self.remote_tag))
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{self.local_cseq if cseq is None else cseq} {method}")
        return request, branch


def _name_addr(address: NameAddr, tag: str) -> str:
    display = f'"{address.display}" ' if address.display else ""
    params = "".join(f";{k}={v}" if v else f";{k}" for k, v in address.params.items()
                     if k != "tag")
    return f"{display}<{address.uri}>{params};tag={tag}"

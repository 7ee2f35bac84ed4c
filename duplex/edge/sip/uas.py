"""The SIP user agent server: one UDP socket, requests in, responses and BYEs out.

Validation and dispatch live here; what each method does to a call lives in ``sip_calls``.
A datagram that fails to parse is dropped with a log line; a request that parses but is wrong
gets a 4xx. Nothing a peer sends can raise out of ``datagram_received``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from duplex.edge.phone.bridge import AgentFactory, Reserve
from duplex.edge.sip.access import AccessPolicy
from duplex.edge.sip.calls import CallHandling
from duplex.edge.sip.client_transactions import ClientTransaction, ClientTransactions, ResponseHandler
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.context import RequestContext
from duplex.edge.sip.dialog import ALLOW, REASONS, build_response
from duplex.edge.sip.guard import SipGuard
from duplex.edge.sip.headers import (
    Via,
    parse_cseq,
    parse_name_addr,
    parse_via,
)
from duplex.edge.sip.info import on_info
from duplex.edge.sip.message import (
    SipParseError,
    SipRequest,
    SipResponse,
    parse_message,
)
from duplex.edge.sip.outbound import OutboundCalls
from duplex.edge.sip.transactions import (
    Address,
    ServerTransaction,
    TransactionTable,
    server_key,
)
from duplex.edge.sip.transfer import on_notify, on_refer

log = logging.getLogger(__name__)
# methods of SIP extensions we recognise but do not do (405), as opposed to unknown ones (501)
KNOWN_METHODS = {"REGISTER", "PRACK", "UPDATE", "SUBSCRIBE", "NOTIFY", "REFER",
                 "MESSAGE", "PUBLISH"}
LOGGED_PER_KIND = 20  # log the first few drops of each kind, then every 100th
COUNTERS = (  # always reported, zero or not, so dashboards and tests see every one
    "calls_answered", "calls_cancelled", "busy", "offers_rejected", "reinvites", "byes_sent",
    "auth_challenges", "auth_failures", "denied", "malformed", "bad_requests",
    "unsupported_methods", "retransmissions", "stray_acks", "stray_responses",
    "answer_failures", "internal_errors",
    # holding the line (issue 15): refusals and reaping, counts only
    "rate_limited", "replies_over_budget", "half_open_reaped", "pending_evicted", "transactions_full",
    "max_duration", "rtp_timeouts", "rtp_wrong_source",
)
# headers an error response keeps when it is cut down to fit the source's reply budget
ESSENTIAL = {"contact", "www-authenticate", "retry-after", "content-type"}


class _SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: SipServer) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.server.datagram_received(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip socket error: %s", exc)


class SipServer:
    def __init__(self, config: SipConfig, agent_factory: AgentFactory,
                 reserve: Reserve | None = None) -> None:
        self.config = config
        self.policy = AccessPolicy(config.allow, config.auth_users, config.realm)
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.guard = SipGuard(config, self.counters)
        self.transactions = TransactionTable(self.send_raw, config.t1_ms / 1000)
        self.client = ClientTransactions(self.send_raw, config.t1_ms / 1000)
        self.calls = CallHandling(self, agent_factory, reserve)
        self.outbound = OutboundCalls(self, self.calls)
        self._transport: asyncio.DatagramTransport | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _SipProtocol(self), local_addr=(self.config.host, self.config.port))
        log.info("SIP listening on udp %s:%d", *self.address)

    @property
    def address(self) -> Address:
        assert self._transport is not None, "server not started"
        host, port = self._transport.get_extra_info("sockname")[:2]
        return host, port

    @property
    def contact_address(self) -> Address:
        return self.config.contact_host, self.address[1]

    async def stop(self) -> None:
        await self.outbound.close()
        await self.calls.close_all()
        self.transactions.close()
        self.client.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def stats(self) -> dict:
        return {**self.calls.stats(), "server_transactions": len(self.transactions.server),
                "client_transactions": len(self.client), "outbound": self.outbound.stats(), **self.counters,
                **self.guard.stats()}

    # -- datagrams in -------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.guard.received(addr[0], len(data))  # the credit for what we may send back
        if not data.strip(b"\r\n"):
            return  # CRLF keep-alive (RFC 5626)
        try:
            self._dispatch(data, addr)
        except Exception:  # a bug must cost one message, never the server
            self.counters["internal_errors"] += 1
            log.exception("error handling a SIP datagram from %s", addr[0])

    def _dispatch(self, data: bytes, addr: Address) -> None:
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._drop("malformed", f"from {addr[0]}:{addr[1]}: {exc}")
            return
        if isinstance(message, SipResponse):
            self._on_response(message)
            return
        if not self.policy.allowed(addr[0]) and not self._in_our_dialog(message):
            self._drop("denied", f"{message.method} from {addr[0]} (not in sip.allow)")
            if message.method != "ACK":
                self.respond_stateless(message, addr, 403)
            return
        context = self._validate(message, addr)
        if context is not None:
            self._on_request(context)

    def _in_our_dialog(self, request: SipRequest) -> bool:
        """A request within a call we placed (the callee's BYE) passes ``sip.allow``, which is for
        who may call in: the callee was chosen by the outbound allowlist."""
        call = self.calls.active.get(request.get("Call-ID") or "")
        return call is not None and call.opening is not None

    def _validate(self, request: SipRequest, addr: Address) -> RequestContext | None:
        try:
            vias = [parse_via(value) for value in request.get_all("Via")]
            if not vias:
                raise SipParseError("no Via")
        except SipParseError as exc:
            self._drop("malformed", f"{request.method} from {addr[0]}: {exc}")
            return None  # without a Via there is nowhere to send a response
        try:
            context = self._identify(request, addr, vias[0])
        except SipParseError as exc:
            self._drop("bad_requests", f"{request.method} from {addr[0]}: {exc}")
            if request.method != "ACK":
                self.respond_stateless(request, addr, 400, reason=f"Bad Request ({exc})"[:120])
            return None
        return context

    @staticmethod
    def _identify(request: SipRequest, addr: Address, via: Via) -> RequestContext:
        for name in ("From", "To", "Call-ID", "CSeq"):
            if not request.get(name):
                raise SipParseError(f"missing {name}")
        cseq, method = parse_cseq(request.get("CSeq") or "")
        if method != request.method:
            raise SipParseError(f"CSeq method {method} does not match {request.method}")
        return RequestContext(request, addr, via, parse_name_addr(request.get("From") or ""),
                              parse_name_addr(request.get("To") or ""),
                              request.get("Call-ID") or "", cseq, server_key(request, via))

    def _on_request(self, context: RequestContext) -> None:
        if context.method == "ACK":
            self.calls.on_ack(context)
            return
        existing = self.transactions.server.get(context.key)
        if existing is not None:  # a retransmission: repeat what we said, do nothing again
            self.counters["retransmissions"] += 1
            if existing.response is not None:
                self.send_raw(existing.response, context.addr)
            return
        if len(self.transactions.server) >= self.config.max_transactions and not self._in_a_call(context):
            # a flood of distinct requests lives 32 s each in the table: past the cap, answered
            # statelessly (within the source's reply budget) and forgotten; calls' own requests pass
            self._drop("transactions_full", f"{context.method} from {context.addr[0]}")
            self.respond_stateless(context.request, context.addr, 503, reason="Service Unavailable (busy)",
                                   headers=[("Retry-After", "5")])
            return
        transaction = self.transactions.open(context.key, context.addr)
        handler = {"INVITE": self.calls.on_invite, "BYE": self.calls.on_bye,
                   "CANCEL": self.calls.on_cancel, "OPTIONS": self._on_options,
                   "INFO": lambda c, t: on_info(self.calls, c, t),
                   "NOTIFY": lambda c, t: on_notify(self.calls, c, t),  # our REFER's progress
                   "REFER": lambda c, t: on_refer(self.calls, c, t),
                   }.get(context.method)
        if handler is not None:
            handler(context, transaction)
            return
        status = 405 if context.method in KNOWN_METHODS else 501
        self._drop("unsupported_methods", f"{context.method} from {context.addr[0]}")
        self.respond(context.request, transaction, status, headers=[("Allow", ALLOW)])

    def _in_a_call(self, context: RequestContext) -> bool:
        return (context.method in ("BYE", "CANCEL", "INVITE", "INFO", "NOTIFY")
                and context.call_id in self.calls.active)

    def _on_options(self, context: RequestContext, transaction: ServerTransaction) -> None:
        to_tag = context.to.tag or self.calls.local_tag_for(context.call_id)
        self.respond(context.request, transaction, 200, to_tag=to_tag,
                     headers=[("Allow", ALLOW), ("Accept", "application/sdp")])

    def _on_response(self, response: SipResponse) -> None:
        if not self.client.received(response):
            self._drop("stray_responses", f"{response.status} {response.reason}")

    # -- datagrams out ------------------------------------------------------------------------

    def respond(self, request: SipRequest, transaction: ServerTransaction, status: int, *,
                to_tag: str = "", headers: list[tuple[str, str]] | None = None,
                body: bytes = b"", reason: str = "", send: bool = True) -> bytes:
        """Answer ``request`` within its server transaction; returns the bytes."""
        payload = self._build(request, transaction.addr, status, to_tag, headers, body, reason,
                              full=True)
        if status >= 200 and not self.guard.fits(transaction.addr[0], len(payload)):
            # over budget as it is: the same answer without what is only nice to have
            keep = request.method == "OPTIONS" or status == 405  # there Allow is the answer
            payload = self._build(request, transaction.addr, status, to_tag, headers, body, "",
                                  full=keep)
        self.transactions.respond(transaction, payload, status, request.method == "INVITE",
                                  send=send)
        return payload

    def _build(self, request: SipRequest, addr: Address, status: int, to_tag: str,
               headers: list[tuple[str, str]] | None, body: bytes, reason: str,
               full: bool) -> bytes:
        response = build_response(request, status, addr, to_tag=to_tag,
                                  reason=reason if full else REASONS.get(status, ""),
                                  server=self.config.user_agent if full else "")
        for name, value in headers or []:
            if full or name.lower() in ESSENTIAL:
                response.add(name, value)
        if body:
            response.add("Content-Type", "application/sdp")  # exactly this: SIPp 3.6 needs it
            response.body = body
        return response.serialize()

    def respond_stateless(self, request: SipRequest, addr: Address, status: int,
                          reason: str = "", headers: list[tuple[str, str]] | None = None) -> None:
        try:
            payload = self._build(request, addr, status, "", headers, b"", reason, full=True)
            if not self.guard.fits(addr[0], len(payload)):
                payload = self._build(request, addr, status, "", headers, b"", "", full=False)
        except SipParseError:
            return
        self.send_raw(payload, addr)

    def send_request(self, request: SipRequest, addr: Address, on_response: ResponseHandler | None = None,
                     on_timeout: Callable[[], None] | None = None) -> ClientTransaction:
        """Our request as a client transaction (``client_transactions``)."""
        return self.client.start(request, addr, on_response, on_timeout)

    def send_raw(self, payload: bytes, addr: Address) -> None:
        if not self.guard.may_send(addr, len(payload)):
            return  # over the source's reply budget (counted there): no amplification
        if self._transport is not None:
            self._transport.sendto(payload, addr)

    def _drop(self, kind: str, detail: str) -> None:
        self.counters[kind] += 1
        count = self.counters[kind]
        if count <= LOGGED_PER_KIND or count % 100 == 0:
            log.warning("sip %s #%d: %s", kind.replace("_", " "), count, detail)

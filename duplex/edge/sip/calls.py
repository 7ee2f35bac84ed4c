"""What INVITE, ACK, BYE and CANCEL do to calls: offer/answer, answering, teardown.

A call owns three resources: its RTP socket, its agent (the conversation) and its dialog
entry. ``_end`` releases all three, whichever side ends the call and however (BYE, CANCEL,
ACK timeout, RTP timeout, server stop), so the stats return to zero after every call.

A call takes its agent (a session slot) only when its 200 OK is ACKed: until then it is
pending, holds an RTP port and a dialog entry, and is dropped after ``ack_timeout_s`` or when
``max_pending_calls`` newer INVITEs need the room (``pending``), so a flood of INVITEs
that never ACK locks no caller out.

One file: a call's life from INVITE to its end (and a placed call's, ``adopt``ed once answered)
reads top to bottom here; its helpers (``pending``, ``session``, ``outbound``) sit beside it.
"""

from __future__ import annotations

import asyncio
import logging
import math

from duplex.edge.phone.bridge import AgentFactory, Reserve
from duplex.edge.sip.access import AuthResult
from duplex.edge.sip.context import RequestContext, SignallingServer
from duplex.edge.sip.dialog import ALLOW, CallState, SipCall, new_tag
from duplex.edge.sip.headers import parse_name_addr
from duplex.edge.sip.media import CallMedia
from duplex.edge.sip.message import SipParseError
from duplex.edge.sip.pending import PendingCalls, in_dialog_destination
from duplex.edge.sip.sdp import (
    LocalDescription,
    Negotiated,
    NoCommonCodec,
    SdpError,
    SessionDescription,
    negotiate,
    parse_sdp,
)
from duplex.edge.sip.session import CallSessions
from duplex.edge.sip.transactions import Address, Retransmitter, ServerTransaction
from duplex.edge.sip.transfer import call_ended

log = logging.getLogger(__name__)
FINAL_RESERVE = 600  # bytes a 1xx must leave in the source's credit for the final answer


class OfferRejected(Exception):
    """An SDP offer we answer with an error status instead of a call."""

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


class CallHandling:
    def __init__(self, server: SignallingServer, agent_factory: AgentFactory,
                 reserve: Reserve | None = None) -> None:
        self.server = server
        self.agent_factory = agent_factory
        self.reserve = reserve  # is a session free? (raises AgentUnavailable); None: always
        self.active: dict[str, SipCall] = {}
        self.pending = PendingCalls(self)
        self.sessions = CallSessions(self)
        self._open_media = 0
        self._cleanups: set[asyncio.Task] = set()

    def stats(self) -> dict:
        return {"calls": len(self.active), "pending": self.pending.count(),
                "rtp_sockets": self._open_media, "agents": self.sessions.open_agents,
                "active": {call.call_id: _call_stats(call) for call in self.active.values()}}

    def local_tag_for(self, call_id: str) -> str:
        call = self.active.get(call_id)
        return call.local_tag if call else new_tag()

    # -- INVITE ---------------------------------------------------------------------------------

    def on_invite(self, context: RequestContext, transaction: ServerTransaction) -> None:
        if context.to.tag:
            self._on_reinvite(context, transaction)
            return
        server = self.server
        if context.call_id in self.active:  # same Call-ID, new branch: a merged request (§8.2.2.2)
            server.respond(context.request, transaction, 482, reason="Loop Detected")
            return
        limited, answer = server.guard.check_rate(context.addr[0])
        if limited is not None:  # answered statelessly: a flood of them leaves no state behind
            server.transactions.forget(transaction.key)
            if answer:
                server.respond_stateless(context.request, context.addr, 503,
                                         headers=[("Retry-After", str(limited.retry_after))])
            return
        if not self._authorised(context, transaction):
            return
        if self.pending.source_full(context.addr[0]):
            server.guard.refusals.note("pending_capped", f"INVITE from {context.addr[0]}: its share of "
                                                         "unanswered calls is taken")
            server.respond(context.request, transaction, 503, reason="Too Many Unconfirmed Calls",
                           headers=[("Retry-After", str(max(1, math.ceil(server.config.ack_timeout_s))))])
            return
        if not self.sessions.room_for_one_more():
            server.counters["busy"] += 1
            server.respond(context.request, transaction, 486)
            return
        try:
            offer, agreed = self._read_offer(context)
        except OfferRejected as exc:
            server.counters["offers_rejected"] += 1
            server.respond(context.request, transaction, exc.status, reason=exc.reason,
                           headers=exc.headers)
            return
        self.pending.make_room()
        self._provisional(context, transaction, 100)
        call = self._new_call(context, transaction)
        transaction.on_cancel = lambda: self._cancelled(call)
        call.answer_task = asyncio.get_running_loop().create_task(
            self._answer(call, context, offer, agreed))

    def _provisional(self, context: RequestContext, transaction: ServerTransaction, status: int,
                     **kwargs) -> None:
        """A 1xx only where it leaves the source credit for the final answer (``reply_budget``)."""
        payload = self.server.respond(context.request, transaction, status, send=False, **kwargs)
        if self.server.guard.fits(transaction.addr[0], len(payload) + FINAL_RESERVE):
            self.server.send_raw(payload, transaction.addr)

    def _authorised(self, context: RequestContext, transaction: ServerTransaction) -> bool:
        policy = self.server.policy
        if not policy.auth_required:
            return True
        result = policy.verify(context.request)
        if result is AuthResult.OK:
            return True
        self.server.counters["auth_challenges"] += 1
        if result is AuthResult.REJECTED:
            self.server.counters["auth_failures"] += 1
            log.warning("INVITE from %s: digest credentials rejected", context.addr[0])
        challenge = policy.challenge(stale=result is AuthResult.STALE)
        self.server.respond(context.request, transaction, 401, to_tag=new_tag(),
                            headers=[("WWW-Authenticate", challenge)])
        return False

    def _new_call(self, context: RequestContext, transaction: ServerTransaction) -> SipCall:
        request = context.request
        contact = request.get("Contact")
        try:
            target = parse_name_addr(contact).uri if contact else context.from_.uri
        except SipParseError:
            target = context.from_.uri
        call = SipCall(
            call_id=context.call_id, local_tag=new_tag(), remote=context.from_,
            local=context.to, remote_target=target, peer=context.addr, invite=request,
            invite_txn=transaction, description=LocalDescription(self.server.config.contact_host),
            remote_cseq=context.cseq, route_set=request.get_all("Record-Route"))
        self.active[call.call_id] = call
        return call

    def _read_offer(self, context: RequestContext
                    ) -> tuple[SessionDescription | None, Negotiated | None]:
        request = context.request
        if not request.body:
            return None, None  # delayed offer: we offer in the 200 OK, the ACK answers
        if request.content_type != "application/sdp":
            raise OfferRejected(415, "Unsupported Media Type", [("Accept", "application/sdp")])
        try:
            offer = parse_sdp(request.body)
            return offer, negotiate(offer)
        except NoCommonCodec as exc:
            warning = f'305 {self.server.config.contact_host} "Incompatible media format: {exc}"'
            raise OfferRejected(488, "Not Acceptable Here", [("Warning", warning)]) from exc
        except SdpError as exc:
            raise OfferRejected(400, f"Bad Request (malformed SDP: {exc})"[:120], []) from exc

    async def _answer(self, call: SipCall, context: RequestContext,
                      offer: SessionDescription | None, agreed: Negotiated | None) -> None:
        server, config = self.server, self.server.config
        contact = [("Contact", f"<sip:duplex@{_host_port(server.contact_address)}>")]
        try:
            call.media = await CallMedia.open(
                config.host, config.rtp_port_min, config.rtp_port_max,
                jitter_depth=config.jitter_depth, symmetric=config.symmetric_rtp,
                rtp_timeout_s=config.rtp_timeout_s)
            self._open_media += 1
            self._provisional(context, call.invite_txn, 180, to_tag=call.local_tag,
                              headers=contact)
            if config.ring_ms:
                await asyncio.sleep(config.ring_ms / 1000)
        except Exception as exc:
            log.exception("could not answer call %s", call.call_id)
            server.counters["answer_failures"] += 1
            status = 503 if isinstance(exc, OSError) else 500
            server.respond(context.request, call.invite_txn, status, to_tag=call.local_tag)
            await self._end(call, "answer failed")
            return
        media = call.media
        body = (call.description.answer(offer, agreed, media.local_port) if offer and agreed
                else call.description.offer(media.local_port))
        call.offer_in_ack = offer is None
        call.state = CallState.ANSWERED
        media.on_timeout = lambda: self.sessions.timed_out(call.call_id)
        media.on_failure = lambda exc: self.sessions.failed(call.call_id, exc)
        if agreed is not None:
            call.agreed = agreed
            media.apply(agreed)  # started (with the agent) once the ACK comes
        self._send_ok(call, context, body, contact)
        server.counters["calls_answered"] += 1

    def _send_ok(self, call: SipCall, context: RequestContext, body: bytes,
                 contact: list[tuple[str, str]]) -> None:
        server = self.server
        payload = server.respond(context.request, call.invite_txn, 200, to_tag=call.local_tag,
                                 body=body, headers=contact + [("Allow", ALLOW)], send=False)
        addr = call.invite_txn.addr
        if call.state is CallState.ANSWERED:  # a new call: pending until ACKed, not for long
            on_give_up, limit_s = self.pending.ack_timed_out(call), server.config.ack_timeout_s
        else:  # a re-INVITE of a confirmed call: the RFC's 64*T1
            on_give_up, limit_s = (lambda: self.hang_up(call.call_id, "no ACK")), None
        call.ok_retransmitter = Retransmitter(  # the 2xx is the dialog's to repeat (§13.3.1.4)
            lambda: server.send_raw(payload, addr), server.transactions.t1,
            on_give_up=on_give_up, limit_s=limit_s)

    def adopt(self, call: SipCall) -> None:
        """A call we placed was answered and ACKed (``outbound``): from now on it is a call like
        any other, its media counted here, its session opened as for an ACKed inbound call."""
        self.active[call.call_id] = call
        self._open_media += 1
        call.state = CallState.ANSWERED
        self.sessions.confirm(call)

    # -- re-INVITE ------------------------------------------------------------------------------

    def _on_reinvite(self, context: RequestContext, transaction: ServerTransaction) -> None:
        server = self.server
        call = self._dialog_of(context)
        if call is None:
            server.respond(context.request, transaction, 481)
            return
        if call.state is CallState.EARLY or context.cseq <= call.remote_cseq:
            # an INVITE overlapping the one still being answered, or out of order (§14.2, §12.2.2)
            server.respond(context.request, transaction, 500, to_tag=call.local_tag,
                           headers=[("Retry-After", "1")])
            return
        call.remote_cseq = context.cseq
        try:
            offer, agreed = self._read_offer(context)
        except OfferRejected as exc:  # the call goes on with the session it had
            server.respond(context.request, transaction, exc.status, to_tag=call.local_tag,
                           reason=exc.reason, headers=exc.headers)
            return
        assert call.media is not None
        if offer is not None and agreed is not None:
            call.agreed = agreed
            call.media.apply(agreed)
            body = call.description.answer(offer, agreed, call.media.local_port)
        else:
            body = call.description.offer(call.media.local_port)
        call.offer_in_ack = offer is None
        contact = [("Contact", f"<sip:duplex@{_host_port(server.contact_address)}>")]
        call.invite, call.invite_txn = context.request, transaction
        if call.ok_retransmitter is not None:
            call.ok_retransmitter.stop()
        self._send_ok(call, context, body, contact)
        server.counters["reinvites"] += 1

    # -- ACK, BYE, CANCEL -----------------------------------------------------------------------

    def on_ack(self, context: RequestContext) -> None:
        if self.server.transactions.acknowledge(context.key):
            return  # the ACK of an error response: the INVITE transaction is done
        call = self._dialog_of(context)
        if call is None:
            self.server.counters["stray_acks"] += 1
            return
        if call.ok_retransmitter is not None:
            call.ok_retransmitter.stop()
            call.ok_retransmitter = None
        if call.offer_in_ack:
            call.offer_in_ack = False
            if not self._answer_in_ack(call, context):
                return
        if call.state is CallState.ANSWERED:
            self.sessions.confirm(call)

    def _answer_in_ack(self, call: SipCall, context: RequestContext) -> bool:
        try:
            agreed = negotiate(parse_sdp(context.request.body))
        except SdpError as exc:  # §13.2.2.4: an unacceptable answer in the ACK ends the call
            log.warning("call %s: unusable SDP answer in ACK: %s", call.call_id, exc)
            self.hang_up(call.call_id, "bad SDP answer")
            return False
        assert call.media is not None
        call.agreed = agreed
        if call.media.running:
            call.media.apply(agreed)
        elif call.agent is not None:
            call.media.start(call.agent, agreed)
        return True

    def on_bye(self, context: RequestContext, transaction: ServerTransaction) -> None:
        call = self._dialog_of(context)
        if call is None:
            self.server.respond(context.request, transaction, 481)
            return
        self.server.respond(context.request, transaction, 200, to_tag=call.local_tag)
        if call.state is CallState.EARLY:
            self._cancelled(call)
            return
        self.schedule_end(call, "caller hung up" if call.opening is None else "callee hung up")

    def on_cancel(self, context: RequestContext, transaction: ServerTransaction) -> None:
        invite_key = (*context.key[:-1], "INVITE")
        invite = self.server.transactions.server.get(invite_key)
        if invite is None:
            self.server.respond(context.request, transaction, 481)
            return
        self.server.respond(context.request, transaction, 200,
                            to_tag=self.local_tag_for(context.call_id))
        if invite.on_cancel is not None:  # still ringing; after a final answer CANCEL does nothing
            invite.on_cancel()

    def _cancelled(self, call: SipCall) -> None:
        if call.answer_task is not None:
            call.answer_task.cancel()
        transaction = call.invite_txn
        transaction.on_cancel = None
        self._respond_to_invite(call, 487)
        self.server.counters["calls_cancelled"] += 1
        self.schedule_end(call, "cancelled")

    def _respond_to_invite(self, call: SipCall, status: int) -> None:
        self.server.respond(call.invite, call.invite_txn, status, to_tag=call.local_tag)

    def _dialog_of(self, context: RequestContext) -> SipCall | None:
        call = self.active.get(context.call_id)
        if call is None or not call.matches(context.from_.tag, context.to.tag):
            return None
        return call

    # -- ending calls ---------------------------------------------------------------------------

    def hang_up(self, call_id: str, reason: str) -> None:
        """End a call from our side: BYE if it was answered, 480 if it was still ringing."""
        call = self.active.get(call_id)
        if call is None:
            return
        if call.state is CallState.EARLY:
            if call.answer_task is not None:
                call.answer_task.cancel()
            self._respond_to_invite(call, 480)
        elif call.state is not CallState.ENDED:
            self._send_bye(call)
        self.schedule_end(call, reason)

    def _send_bye(self, call: SipCall) -> None:
        host, port = self.server.contact_address
        request, _ = call.build_request("BYE", host, port)
        self.server.send_request(request, in_dialog_destination(call))
        self.server.counters["byes_sent"] += 1

    def schedule_end(self, call: SipCall, reason: str) -> None:
        if call.state is CallState.ENDED:
            return
        call.state = CallState.ENDED
        self.active.pop(call.call_id, None)
        task = asyncio.get_running_loop().create_task(self._end(call, reason))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _end(self, call: SipCall, reason: str) -> None:
        call.state = CallState.ENDED
        self.active.pop(call.call_id, None)
        call_ended(call)  # a transfer under way learns it
        if call.ok_retransmitter is not None:
            call.ok_retransmitter.stop()
        self.sessions.release(call)
        current = asyncio.current_task()
        if call.answer_task is not None and call.answer_task is not current:
            call.answer_task.cancel()
            await asyncio.gather(call.answer_task, return_exceptions=True)
        media, agent = call.media, call.agent
        call.media = call.agent = None
        if media is not None:
            self.server.counters["rtp_wrong_source"] += media.stats.wrong_source
            await media.close()
            self._open_media -= 1
        if agent is not None:
            try:
                await agent.close()
            except Exception:
                log.exception("call %s: closing its agent failed", call.call_id)
            self.sessions.open_agents -= 1
        log.info("call %s ended: %s", call.call_id, reason)
        if call.on_ended is not None:
            call.on_ended(reason)

    async def close_all(self) -> None:
        for call_id in list(self.active):
            self.hang_up(call_id, "server stopping")
        if self._cleanups:
            await asyncio.gather(*list(self._cleanups), return_exceptions=True)


def _call_stats(call: SipCall) -> dict:
    stats: dict = {"state": call.state.value, "codec": call.agreed.codec if call.agreed else None}
    if call.media is not None:
        media, jitter = call.media.stats, call.media.jitter.stats
        stats.update(packets_in=media.packets_received, packets_out=media.packets_sent,
                     malformed=media.malformed, wrong_source=media.wrong_source,
                     lost=jitter.lost, late=jitter.late, duplicate=jitter.duplicate,
                     underruns=jitter.underruns, resyncs=jitter.resyncs)
    return stats


def _host_port(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

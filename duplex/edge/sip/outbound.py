"""Calls duplex places (UAC): the INVITE with our SDP offer, a trunk's digest challenge answered
once, ringing, the ringing timeout (CANCEL), the callee's refusals (486, 603, 408 ...) and, on
200 OK, the ACK and the same conversation an inbound call gets (``CallHandling.adopt``).

Bounded before anything is sent: the target must match the allowlist (empty: the feature is
off), at most ``max_calls`` placed calls live at once and ``per_minute`` started in any minute,
and a session must be free. A placed call holds an RTP port while it rings; the ringing timeout
and timer B bound that, and whatever ends it releases the port.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import secrets
import socket
import time

from duplex.edge.phone.bridge import CallOpening
from duplex.edge.sip.calls import CallHandling
from duplex.edge.sip.context import SignallingServer
from duplex.edge.sip.dialog import ALLOW, SipCall, new_branch, new_tag
from duplex.edge.sip.digest_client import answer_challenge
from duplex.edge.sip.headers import NameAddr, parse_name_addr, parse_uri
from duplex.edge.sip.media import CallMedia
from duplex.edge.sip.message import SipParseError, SipRequest, SipResponse
from duplex.edge.sip.pending import in_dialog_destination
from duplex.edge.sip.placed import PlacedCall, PlacedState
from duplex.edge.sip.sdp import LocalDescription, SdpError, negotiate, parse_sdp
from duplex.edge.sip.targets import TargetRefused, check_target
from duplex.edge.sip.transactions import Address, ServerTransaction

log = logging.getLogger(__name__)
KEPT = 200  # finished placed calls kept for GET (the oldest go first)


class OutboundRefused(Exception):
    """A placed call refused before anything was sent: the HTTP status and a code for the API."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after_s = status, code, retry_after_s


class OutboundCalls:
    def __init__(self, server: SignallingServer, calls: CallHandling) -> None:
        self.server = server
        self.calls = calls
        self.config = server.config.outbound
        self.placed: collections.OrderedDict[str, PlacedCall] = collections.OrderedDict()
        self._started: collections.deque[float] = collections.deque()  # when the last minute's calls began
        self.ringing_media = 0  # RTP sockets of calls still ringing (the call table counts the rest)
        self._closing: set[asyncio.Task] = set()  # RTP sockets of failed calls being closed

    def stats(self) -> dict:
        live = [p for p in self.placed.values() if p.live]
        return {"live": len(live), "ringing_rtp_sockets": self.ringing_media}

    # -- asking ---------------------------------------------------------------------------------

    def place(self, target: str, opening: CallOpening) -> PlacedCall:
        """Check the ask and start dialling; raises OutboundRefused (nothing sent, nothing held)."""
        self._admit(target)
        self._started.append(time.monotonic())
        placed = PlacedCall(target, opening)
        # screening's thresholds are the server's, its verdicts join the call's events
        placed.opening = dataclasses.replace(opening, report=placed.note, machine_settings=self.config.amd)
        self.placed[placed.id] = placed
        self._forget_old()
        placed.task = asyncio.get_running_loop().create_task(self._dial(placed))
        return placed

    def _admit(self, target: str) -> None:
        config = self.config
        try:
            check_target(target, config.allow)
        except TargetRefused as exc:
            raise OutboundRefused(exc.status, exc.code, str(exc)) from None
        if sum(p.live for p in self.placed.values()) >= config.max_calls:
            raise OutboundRefused(429, "outbound_calls_capped", f"{config.max_calls} placed calls are live; "
                                                                "try again when one ends", retry_after_s=5)
        now = time.monotonic()
        while self._started and now - self._started[0] >= 60:
            self._started.popleft()
        if len(self._started) >= config.per_minute:
            wait = max(1, int(60 - (now - self._started[0])) + 1)
            raise OutboundRefused(429, "outbound_rate_limited", f"at most {config.per_minute} placed calls a "
                                                                "minute", retry_after_s=wait)
        if not self.calls.sessions.room_for_one_more():
            raise OutboundRefused(503, "server_busy", "no session is free for the call now", retry_after_s=5)

    def _forget_old(self) -> None:
        finished = [key for key, placed in self.placed.items() if not placed.live]
        for key in finished[:max(0, len(finished) - KEPT)]:
            del self.placed[key]

    # -- dialling -------------------------------------------------------------------------------

    async def _dial(self, placed: PlacedCall) -> None:
        try:
            await self._open_and_invite(placed)
        except Exception:  # a bug costs this call (failed, its socket closed), never the cap's slot
            log.exception("placed call %s: dialling failed", placed.id)
            self._fail(placed, None, "internal error while dialling")

    async def _open_and_invite(self, placed: PlacedCall) -> None:
        server, config = self.server, self.server.config
        try:
            placed.destination = await self._destination(placed.target)
            placed.media = await CallMedia.open(config.host, config.rtp_port_min, config.rtp_port_max,
                                                jitter_depth=config.jitter_depth, symmetric=config.symmetric_rtp,
                                                rtp_timeout_s=config.rtp_timeout_s)
        except OSError as exc:
            self._fail(placed, None, f"cannot place the call: {exc}")
            return
        self.ringing_media += 1
        if placed.cancel_wanted or not placed.live:  # hung up (API, server stopping) while we got ready
            self._fail(placed, None, placed.cancel_wanted)
            self._close_media(placed)  # (already failed: _fail did nothing)
            return
        server.guard.trust({placed.destination[0]})  # we chose to send there: no reply budget
        host, port = server.contact_address
        local = NameAddr("", f"sip:{self.config.from_user}@{_host_port((host, port))}")
        call = SipCall(
            call_id=f"{secrets.token_hex(12)}@{host}", local_tag=new_tag(), remote=NameAddr("", placed.target),
            local=local, remote_target=placed.target, peer=placed.destination, invite=SipRequest(),
            # a call we place has no INVITE of the peer's; a re-INVITE of the callee's replaces this
            invite_txn=ServerTransaction(("placed", placed.id), placed.destination),
            description=LocalDescription(config.contact_host), remote_cseq=0, opening=placed.opening,
            on_ended=lambda reason: self._ended(placed, reason), on_event=placed.note)
        placed.call = call
        placed.offer = call.description.offer(placed.media.local_port)
        placed.note("calling", detail=placed.target)
        placed.ring_timer = asyncio.get_running_loop().call_later(
            self.config.ring_timeout_s, self.cancel, placed, "no answer")
        self._send_invite(placed, None)

    async def _destination(self, target: str) -> Address:
        if self.config.trunk is not None:
            host, _, port = self.config.trunk.rpartition(":")
            where = (host.strip("[]"), int(port))
        else:
            uri = parse_uri(target)
            where = (uri.host.strip("[]"), uri.port or 5060)
        loop = asyncio.get_running_loop()
        try:
            found = await loop.getaddrinfo(where[0], where[1], type=socket.SOCK_DGRAM, family=socket.AF_INET)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {where[0]!r}: {exc}") from None
        return str(found[0][4][0]), where[1]

    def _send_invite(self, placed: PlacedCall, authorization: tuple[str, str] | None) -> None:
        call = placed.call
        assert call is not None and placed.destination is not None
        host, port = self.server.contact_address
        call.local_cseq += 1
        request = SipRequest(method="INVITE", uri=placed.target)
        request.add("Via", f"SIP/2.0/UDP {_host_port((host, port))};branch={new_branch()};rport")
        request.add("Max-Forwards", "70")
        request.add("From", f"<{call.local.uri}>;tag={call.local_tag}")
        request.add("To", f"<{placed.target}>")
        request.add("Call-ID", call.call_id)
        request.add("CSeq", f"{call.local_cseq} INVITE")
        request.add("Contact", f"<{call.local.uri}>")
        request.add("Allow", ALLOW)
        request.add("User-Agent", self.server.config.user_agent)
        if authorization is not None:
            request.add(*authorization)
        request.add("Content-Type", "application/sdp")
        request.body = placed.offer
        call.invite = request
        placed.invite = self.server.send_request(request, placed.destination,
                                                 lambda response: self._on_response(placed, response),
                                                 lambda: self._fail(placed, 408, "no response to the INVITE"))

    # -- answers --------------------------------------------------------------------------------

    def _on_response(self, placed: PlacedCall, response: SipResponse) -> None:
        status = response.status
        if status < 200:
            if status > 100 and placed.state is PlacedState.CALLING:
                placed.state = PlacedState.RINGING
                placed.note("ringing", status)
            if placed.cancel_wanted:
                self._send_cancel(placed)
        elif status < 300:
            self._answered(placed, response)
        elif status in (401, 407) and self._retry_with_credentials(placed, response):
            return
        else:
            self._fail(placed, status, response.reason or "refused")

    def _retry_with_credentials(self, placed: PlacedCall, response: SipResponse) -> bool:
        config = self.config
        if placed.auth_tried or config.trunk_user is None or config.trunk_password is None or placed.cancel_wanted:
            return False
        header = "WWW-Authenticate" if response.status == 401 else "Proxy-Authenticate"
        try:
            value = answer_challenge(response.get(header) or "", "INVITE", placed.target, config.trunk_user,
                                     config.trunk_password.get_secret_value())
        except SipParseError as exc:
            log.warning("placed call %s: cannot answer the challenge: %s", placed.id, exc)
            return False
        placed.auth_tried = True
        placed.note("authenticating", response.status)
        answer = "Authorization" if response.status == 401 else "Proxy-Authorization"
        self._send_invite(placed, (answer, value))
        return True

    def _answered(self, placed: PlacedCall, response: SipResponse) -> None:
        call, media = placed.call, placed.media
        assert call is not None and placed.destination is not None
        if placed.ack:  # a retransmitted 2xx: our ACK was lost
            self.server.send_raw(placed.ack, in_dialog_destination(call))
            return
        if placed.state not in (PlacedState.CALLING, PlacedState.RINGING) or media is None:
            return  # a 2xx after we gave up (timer B): nothing left to ACK into
        problem = ""
        try:
            call.remote = parse_name_addr(response.get("To") or "")
            contact = response.get("Contact")
            call.remote_target = parse_name_addr(contact).uri if contact else placed.target
            call.agreed = negotiate(parse_sdp(response.body))
        except (SipParseError, SdpError) as exc:
            problem = f"unusable answer: {exc}"
        call.route_set = list(reversed(response.get_all("Record-Route")))
        host, port = self.server.contact_address
        ack, _ = call.build_request("ACK", host, port, cseq=call.local_cseq)
        placed.ack = ack.serialize()
        self.server.send_raw(placed.ack, in_dialog_destination(call))
        if problem or placed.cancel_wanted:
            bye, _ = call.build_request("BYE", host, port)
            self.server.send_request(bye, in_dialog_destination(call))
            self._fail(placed, response.status, problem or placed.cancel_wanted)
            return
        self._stop_ringing(placed)
        placed.media = None  # the call holds it now
        self.ringing_media -= 1
        call.media = media
        media.on_timeout = lambda: self.calls.sessions.timed_out(call.call_id)
        media.on_failure = lambda exc: self.calls.sessions.failed(call.call_id, exc)
        placed.state, placed.sip_status = PlacedState.ANSWERED, response.status
        placed.note("answered", response.status)
        self.calls.adopt(call)

    # -- ending ---------------------------------------------------------------------------------

    def cancel(self, placed: PlacedCall, why: str) -> None:
        """Stop a ringing call (ring timeout, the API): CANCEL once something answered (§9.1)."""
        if placed.state not in (PlacedState.CALLING, PlacedState.RINGING) or placed.cancel_wanted:
            return
        placed.cancel_wanted = why
        placed.note("cancelling", detail=why)
        if placed.state is PlacedState.RINGING:
            self._send_cancel(placed)

    def hang_up(self, placed: PlacedCall) -> None:
        if placed.state is PlacedState.ANSWERED and placed.call is not None:
            self.calls.hang_up(placed.call.call_id, "hung up through the API")
        else:
            self.cancel(placed, "cancelled through the API")

    def _send_cancel(self, placed: PlacedCall) -> None:
        call, invite = placed.call, placed.invite
        if placed.cancel_sent or call is None or invite is None or placed.destination is None:
            return
        placed.cancel_sent = True
        self.server.client.cancel_retransmissions(invite)
        request = SipRequest(method="CANCEL", uri=invite.request.uri)  # §9.1: the INVITE's, bar CSeq method
        for name in ("Via", "From", "To", "Call-ID"):
            request.add(name, invite.request.get(name) or "")
        request.add("Max-Forwards", "70")
        request.add("CSeq", f"{call.local_cseq} CANCEL")
        self.server.send_request(request, placed.destination)

    def _fail(self, placed: PlacedCall, status: int | None, reason: str) -> None:
        if not placed.live or placed.state is PlacedState.ANSWERED:
            return
        if placed.cancel_wanted and status in (None, 408, 487):
            reason = placed.cancel_wanted  # our CANCEL's answer (or the end of an unanswered INVITE): why we gave up
        placed.state, placed.sip_status, placed.reason = PlacedState.FAILED, status, reason
        placed.note("failed", status, reason)
        log.info("placed call %s to %s failed: %s %s", placed.id, placed.target, status or "", reason)
        self._stop_ringing(placed)
        self._close_media(placed)

    def _close_media(self, placed: PlacedCall) -> None:
        media, placed.media = placed.media, None
        if media is not None:
            self.ringing_media -= 1
            task = asyncio.get_running_loop().create_task(media.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _stop_ringing(self, placed: PlacedCall) -> None:
        if placed.ring_timer is not None:
            placed.ring_timer.cancel()
            placed.ring_timer = None
        if placed.destination is not None and placed.call is not None:
            self.server.guard.untrust({placed.destination[0]})

    def _ended(self, placed: PlacedCall, reason: str) -> None:
        if placed.state is PlacedState.ANSWERED:
            placed.state, placed.reason = PlacedState.ENDED, reason
            placed.note("ended", detail=reason)

    async def close(self) -> None:
        for placed in list(self.placed.values()):
            if placed.state in (PlacedState.CALLING, PlacedState.RINGING):
                self.cancel(placed, "server stopping")
                self._fail(placed, None, "server stopping")
            if placed.task is not None:
                placed.task.cancel()
        await asyncio.gather(*(p.task for p in self.placed.values() if p.task is not None),
                             *self._closing, return_exceptions=True)


def _host_port(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

"""Blind transfer (RFC 3515 REFER, without RFC 4488): the conversation asks (``SipCallControl``)
once the agent's current line has been heard (``session/call_tools.py`` waits for it), and we
send REFER with Refer-To and Referred-By; the far end
answers 202 and tells how its new call goes in NOTIFYs with message/sipfrag bodies (each
answered 200): trying, ringing, then ok (we end our leg with BYE) or failed (the call goes on
with the agent). The outcome comes back as a ``TransferResult``; each step is logged and, for a
call we placed, kept in its events.

What peers send us about transfers is checked before it touches a call: a NOTIFY outside any
dialog, or for no REFER of ours, gets 481; another event package 489; another body type 415; a
sipfrag without a status line 400. We do not follow a peer's REFER (403, or 481 / 400 when it is
not even that). None of these harms the call or any other.
"""

from __future__ import annotations

import asyncio
import logging
import re

from duplex.edge.sip.context import CallTable, RequestContext
from duplex.edge.sip.dialog import CallState, Referral, SipCall
from duplex.edge.sip.headers import parse_name_addr, parse_uri
from duplex.edge.sip.message import SipParseError
from duplex.edge.sip.pending import in_dialog_destination
from duplex.edge.sip.targets import TargetRefused, check_target
from duplex.edge.sip.transactions import ServerTransaction
from duplex.session.call_control import CallAction, CallControlRefused, TransferResult

log = logging.getLogger(__name__)
OUTCOME_WAIT_S = 60.0  # after 202, the far end has this long to tell the new call's outcome
_NUMBER = re.compile(r"\+?[0-9*#]{1,32}")
_SIPFRAG = re.compile(r"SIP/2\.0 ([1-6][0-9]{2})(?: (.*))?")


def _refused(reason: str) -> CallControlRefused:
    return CallControlRefused(CallAction.TRANSFER, reason)


def refer_target(call: SipCall, target: str, allow: list[str]) -> str:
    """The Refer-To URI: ``target`` itself, or a bare number at the far end's host; raises
    CallControlRefused unless the outbound allowlist allows it."""
    if _NUMBER.fullmatch(target):
        try:
            where = parse_uri(call.remote_target)
        except SipParseError:
            raise _refused(f"cannot place the number {target!r}: the far end's address is not a SIP URI") from None
        target = f"sip:{target}@{where.host}" + (f":{where.port}" if where.port else "")
    try:
        return check_target(target, allow)
    except TargetRefused as exc:
        raise _refused(str(exc)) from None


async def refer(calls: CallTable, call: SipCall, target: str) -> TransferResult:
    """Transfer ``call`` to ``target``; returns how it went (raises CallControlRefused when it
    cannot be tried at all). A transfer that ends well ends our leg."""
    if call.state is not CallState.CONFIRMED:
        raise _refused("the call is not connected")
    if call.referral is not None:
        raise _refused(f"a transfer of this call (to {call.referral.target}) is already under way")
    uri = refer_target(call, target, calls.server.config.outbound.allow)
    referral = call.referral = Referral(uri, asyncio.get_running_loop().create_future())
    try:
        _send_refer(calls, call, referral)
        try:
            result = await asyncio.wait_for(asyncio.shield(referral.outcome), OUTCOME_WAIT_S)
        except TimeoutError:
            result = TransferResult(accepted=False, detail=f"no outcome from the far end within {OUTCOME_WAIT_S:g} s; "
                                                           "the call goes on")
    finally:
        call.referral = None
    if result.accepted:
        calls.hang_up(call.call_id, f"transferred to {uri}")
    return result


def _send_refer(calls: CallTable, call: SipCall, referral: Referral) -> None:
    host, port = calls.server.contact_address
    request, _ = call.build_request("REFER", host, port)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request.add("Contact", f"<sip:duplex@{where}>")  # where the far end reaches us (its NOTIFYs)
    request.add("Refer-To", f"<{referral.target}>")
    request.add("Referred-By", f"<{call.local.uri}>")

    def answered(response) -> None:
        if response.status < 200:
            return
        if response.status < 300:
            referral.accepted = True
            _note(call, referral, "accepted", response.status)
            return
        _settle(call, referral, TransferResult(
            accepted=False, status=response.status,
            detail=f"the far end refused the transfer: {response.status} {response.reason}; the call goes on"))

    calls.server.send_request(request, in_dialog_destination(call), answered, lambda: _settle(
        call, referral, TransferResult(accepted=False, detail="no answer to the REFER; the call goes on")))


def _settle(call: SipCall, referral: Referral, result: TransferResult) -> None:
    if referral.outcome.done():
        return
    referral.outcome.set_result(result)
    _note(call, referral, "ok" if result.accepted else "failed", result.status, result.detail)


def _note(call: SipCall, referral: Referral, state: str, status: int | None, detail: str = "") -> None:
    """One step of the transfer: logged, told to the conversation (its events), and kept in a
    placed call's events; a step told again (NOTIFYs repeating "trying") is not told twice."""
    if state == referral.state:
        return
    referral.state = state
    log.info("call %s transfer to %s: %s %s %s", call.call_id, referral.target, state, status or "", detail)
    if call.agent is not None:
        call.agent.transfer_progress(referral.target, state, status, detail)
    if call.on_event is not None:
        call.on_event("transfer", status, f"{state} {referral.target}" + (f": {detail}" if detail else ""))


def call_ended(call: SipCall) -> None:
    """The call ended while a transfer was under way: after a 202 the far end hanging up is how
    some phones say the transfer went through."""
    referral = call.referral
    if referral is not None:
        _settle(call, referral, TransferResult(
            accepted=referral.accepted, detail="the far end ended the call after accepting the transfer"
            if referral.accepted else "the call ended before the far end accepted the transfer"))


# -- what peers send ----------------------------------------------------------------------------

def _dialog(calls: CallTable, context: RequestContext) -> SipCall | None:
    call = calls.active.get(context.call_id)
    if call is None or not call.matches(context.from_.tag, context.to.tag):
        return None
    return call


def on_notify(calls: CallTable, context: RequestContext, transaction: ServerTransaction) -> None:
    server, request = calls.server, context.request
    call = _dialog(calls, context)
    if call is None:
        server.respond(request, transaction, 481)
        return
    event = (request.get("Event") or "").split(";")[0].strip().lower()
    if event != "refer":
        server.respond(request, transaction, 489, to_tag=call.local_tag, headers=[("Allow-Events", "refer")])
        return
    referral = call.referral
    if referral is None:  # no REFER of ours under way: no such subscription
        server.respond(request, transaction, 481, to_tag=call.local_tag)
        return
    if request.content_type != "message/sipfrag":
        server.respond(request, transaction, 415, to_tag=call.local_tag, headers=[("Accept", "message/sipfrag")])
        return
    first = request.body.decode("utf-8", "replace").strip().split("\r\n")[0].split("\n")[0].strip()
    match = _SIPFRAG.fullmatch(first)
    if match is None:
        server.respond(request, transaction, 400, to_tag=call.local_tag,
                       reason="Bad Request (the sipfrag has no SIP status line)")
        return
    server.respond(request, transaction, 200, to_tag=call.local_tag)
    status, reason = int(match.group(1)), (match.group(2) or "").strip()
    _progress(call, referral, status, reason)


def _progress(call: SipCall, referral: Referral, status: int, reason: str) -> None:
    if status < 200:
        _note(call, referral, "ringing" if status in (180, 183) else "trying", status, reason)
    elif status < 300:
        _settle(call, referral, TransferResult(accepted=True, status=status,
                                               detail=f"transferred to {referral.target}"))
    else:
        _settle(call, referral, TransferResult(
            accepted=False, status=status,
            detail=f"the transfer to {referral.target} failed: {status} {reason}; the call goes on"))


def on_refer(calls: CallTable, context: RequestContext, transaction: ServerTransaction) -> None:
    """A peer asks us to transfer: we do not follow (the conversation decides transfers)."""
    server, request = calls.server, context.request
    call = _dialog(calls, context)
    if call is None:
        server.respond(request, transaction, 481)
        return
    try:
        parse_uri(parse_name_addr(request.get("Refer-To") or "").uri)
    except SipParseError as exc:
        server.respond(request, transaction, 400, to_tag=call.local_tag,
                       reason=f"Bad Request (Refer-To: {exc})"[:120])
        return
    server.respond(request, transaction, 403, to_tag=call.local_tag,
                   reason="Forbidden (this agent does not follow transfer requests)")

"""Keypad digits in SIP INFO (for peers that send them there instead of RFC 4733 events):
``application/dtmf-relay`` (``Signal=5`` / ``Duration=160`` lines, Cisco's) and
``application/dtmf`` (the digit alone). A digit joins the call as an RTP event's does; an INFO
of another kind is 415, one outside a confirmed call 481, a malformed body 400."""

from __future__ import annotations

from duplex.edge.sip.context import CallTable, RequestContext
from duplex.edge.sip.dialog import CallState
from duplex.edge.sip.transactions import ServerTransaction
from duplex.session.call_control import DTMF_DIGITS

ACCEPTED = ("application/dtmf-relay", "application/dtmf")
MAX_BODY = 256  # a digit and its duration; anything longer is not a keypad INFO


class NotADigit(ValueError):
    pass


def info_digit(content_type: str, body: bytes) -> str:
    """The digit an INFO body carries; raises NotADigit naming what is wrong."""
    if len(body) > MAX_BODY:
        raise NotADigit(f"body of {len(body)} bytes")
    text = body.decode("utf-8", "replace").strip()
    if content_type == "application/dtmf-relay":
        fields = dict(line.partition("=")[::2] for line in text.splitlines())
        text = {k.strip().lower(): v.strip() for k, v in fields.items()}.get("signal", "")
    digit = {"10": "*", "11": "#"}.get(text, text).upper()  # some phones send events' numbers
    if len(digit) != 1 or digit not in DTMF_DIGITS:
        raise NotADigit(f"no keypad digit in {text[:20]!r}")
    return digit


def on_info(calls: CallTable, context: RequestContext, transaction: ServerTransaction) -> None:
    server, request = calls.server, context.request
    call = calls.active.get(context.call_id)
    if call is None or not call.matches(context.from_.tag, context.to.tag) or call.state is not CallState.CONFIRMED:
        server.respond(request, transaction, 481)
        return
    if request.content_type not in ACCEPTED:
        server.counters["info_refused"] += 1
        server.respond(request, transaction, 415, to_tag=call.local_tag, headers=[("Accept", ", ".join(ACCEPTED))])
        return
    try:
        digit = info_digit(request.content_type, request.body)
    except NotADigit as exc:
        server.counters["info_refused"] += 1
        server.respond(request, transaction, 400, to_tag=call.local_tag, reason=f"Bad Request ({exc})"[:80])
        return
    server.respond(request, transaction, 200, to_tag=call.local_tag)
    if call.media is not None:
        call.media.keypad(digit)

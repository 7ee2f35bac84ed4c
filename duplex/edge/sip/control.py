"""What a SIP call does for its conversation (``session/call_control.py``): hang up with a BYE,
send keypad digits as RFC 4733 events on its RTP stream, transfer with REFER (``transfer``)."""

from __future__ import annotations

from duplex.edge.sip.context import CallTable
from duplex.edge.sip.dialog import CallState, SipCall
from duplex.edge.sip.transfer import refer
from duplex.session.call_control import CallAction, CallControlRefused, TransferResult


class SipCallControl:
    def __init__(self, calls: CallTable, call: SipCall) -> None:
        self._calls = calls
        self._call = call

    def end(self, reason: str) -> None:
        self._calls.hang_up(self._call.call_id, reason)  # BYE; nothing once the call has ended

    def send_dtmf(self, digits: str) -> None:
        media = self._call.media
        if media is None or self._call.state is not CallState.CONFIRMED:
            raise CallControlRefused(CallAction.DTMF, "the call has ended")
        media.send_dtmf(digits)

    async def transfer(self, target: str) -> TransferResult:
        return await self.refer(target)

    async def refer(self, target: str) -> TransferResult:
        """Blind transfer with REFER (RFC 3515): ``transfer``."""
        return await refer(self._calls, self._call, target)

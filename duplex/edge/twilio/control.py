"""What a Twilio stream does for its conversation (``session/call_control.py``): it can end (the
stream is closed once its last audio has played; with ``<Connect><Stream>`` and nothing after it,
Twilio then hangs up). Keypad digits out and transfer need Twilio's REST API (a call update with
new TwiML), which this door does not use: both are refused, saying so."""

from __future__ import annotations

from collections.abc import Callable

from duplex.session.call_control import CallAction, CallControlRefused, TransferResult

_REST = "needs Twilio's REST API (a call update with new TwiML), which this server does not use"


class TwilioCallControl:
    def __init__(self, end: Callable[[str], None]) -> None:
        self._end = end  # the stream's: close it once its last audio has played

    def end(self, reason: str) -> None:
        self._end(reason)

    def send_dtmf(self, digits: str) -> None:
        raise CallControlRefused(CallAction.DTMF, f"a Twilio media stream cannot send keypad digits: that {_REST}")

    async def transfer(self, target: str) -> TransferResult:
        raise CallControlRefused(CallAction.TRANSFER, f"a Twilio media stream cannot transfer its call: that {_REST}")

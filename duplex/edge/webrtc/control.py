"""What a WebRTC call does for its conversation (``session/call_control.py``): it can end (its
last events are flushed, then the peer is closed); a browser has no keypad tones to send nor a
line to transfer."""

from __future__ import annotations

from collections.abc import Callable

from duplex.session.call_control import CallAction, CallControlRefused, TransferResult


class WebRtcCallControl:
    def __init__(self, end: Callable[[str], None]) -> None:
        self._end = end  # the gateway's: flush the call's last events, then close it

    def end(self, reason: str) -> None:
        self._end(reason)

    def send_dtmf(self, digits: str) -> None:
        raise CallControlRefused(CallAction.DTMF, "a WebRTC call carries no keypad tones (the client can play "
                                                  "them itself)")

    async def transfer(self, target: str) -> TransferResult:
        raise CallControlRefused(CallAction.TRANSFER, "a WebRTC call cannot be transferred; transfer is for "
                                                      "phone calls")

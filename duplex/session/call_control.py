"""What a conversation may ask of the call it is on: hang up, send keypad digits, transfer.

The door that carries the call implements ``CallControl`` (the SIP leg: BYE, RFC 4733 events
on its RTP stream, REFER; a Twilio stream: close it; a WebRTC call: close it) and gives it to
the session with the ``Door`` (``door.py``). A door that cannot do something refuses it with
``CallControlRefused`` naming why, so the agent's tool result and the client's ``error`` event
say it instead of the request vanishing. Waiting for the agent's reply to finish playing before
hanging up is the session's business (``call_tools.py``): ``end`` ends the call at once.

The session knows no transport: it sees this protocol only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

import msgspec

DTMF_DIGITS = frozenset("0123456789*#ABCD")  # RFC 4733 events 0-15
MAX_DTMF_DIGITS = 32  # digits one request may send


class CallAction(enum.StrEnum):
    END = "end"
    DTMF = "dtmf"
    TRANSFER = "transfer"


class CallControlRefused(Exception):
    """The call cannot do ``action`` (the door cannot, or not now); the message says why."""

    def __init__(self, action: CallAction, reason: str) -> None:
        super().__init__(reason)
        self.action = action
        self.reason = reason


class TransferResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a transfer went: ``accepted`` by the far end (REFER 202) and, once known, the final
    status of the new leg (a NOTIFY's sipfrag, e.g. 200 or 486); ``detail`` in words."""

    accepted: bool
    status: int | None = None
    detail: str = ""


class CallControl(Protocol):
    def end(self, reason: str) -> None:
        """End the call now (SIP BYE, the stream or peer closed). Harmless once it has ended."""

    def send_dtmf(self, digits: str) -> None:
        """Send keypad ``digits`` (already checked: ``DTMF_DIGITS``, at most ``MAX_DTMF_DIGITS``)
        to the far end, in order, without blocking; raises CallControlRefused."""

    async def transfer(self, target: str) -> TransferResult:
        """Hand the call to ``target`` (a SIP URI or a number); raises CallControlRefused."""


class NoCallControl:
    """For a door that carries no call it could end or steer (a test's door, a raw PCM socket)."""

    def __init__(self, transport: str = "this door") -> None:
        self._where = transport

    def end(self, reason: str) -> None:
        raise CallControlRefused(CallAction.END, f"{self._where} cannot end its call from the server")

    def send_dtmf(self, digits: str) -> None:
        raise CallControlRefused(CallAction.DTMF, f"{self._where} cannot send keypad digits")

    async def transfer(self, target: str) -> TransferResult:
        raise CallControlRefused(CallAction.TRANSFER, f"{self._where} cannot transfer calls")


class EndOnlyCallControl(NoCallControl):
    """For a door that can end its call and do nothing else with it (a WebSocket session)."""

    def __init__(self, end: Callable[[str], None], transport: str) -> None:
        super().__init__(transport)
        self._end = end

    def end(self, reason: str) -> None:
        self._end(reason)


def check_digits(digits: str) -> str:
    """``digits`` upper-cased, or ValueError naming what is wrong."""
    cleaned = digits.upper()
    if not cleaned:
        raise ValueError("no digits given")
    if len(cleaned) > MAX_DTMF_DIGITS:
        raise ValueError(f"{len(cleaned)} digits; at most {MAX_DTMF_DIGITS} per request")
    bad = sorted(set(cleaned) - DTMF_DIGITS)
    if bad:
        raise ValueError(f"not keypad digits: {''.join(bad)!r} (0-9, *, #, A-D)")
    return cleaned

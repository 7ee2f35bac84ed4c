"""A call duplex places, as the API shows it: its state, the SIP status that ended it, and its
events (calling, ringing, answered, failed, ended; transfers), each timed from the request."""

from __future__ import annotations

import asyncio
import enum
import secrets
import time
from dataclasses import dataclass, field

import msgspec

from duplex.edge.phone.bridge import CallOpening
from duplex.edge.sip.client_transactions import ClientTransaction
from duplex.edge.sip.dialog import SipCall
from duplex.edge.sip.media import CallMedia
from duplex.edge.sip.transactions import Address

MAX_EVENTS = 64  # per placed call


class PlacedState(enum.Enum):
    CALLING = "calling"  # INVITE sent, nothing but 100 Trying back
    RINGING = "ringing"  # 180/183
    ANSWERED = "answered"  # 200 OK ACKed: the conversation runs
    ENDED = "ended"  # answered, then over (either side hung up)
    FAILED = "failed"  # never answered: busy, declined, no answer, unreachable, refused


class CallEvent(msgspec.Struct, kw_only=True):
    type: str  # calling | ringing | answered | failed | ended | transfer
    at_s: float  # seconds since the call was asked for
    sip_status: int | None = None
    detail: str = ""


class PlacedView(msgspec.Struct, kw_only=True):
    """``GET /v1/calls/outbound/{id}``: the call as its placer sees it."""

    id: str
    to: str
    state: str
    sip_status: int | None  # the final answer to our INVITE (None while ringing, or if none came)
    reason: str  # why it failed or ended ("" while it goes on)
    sip_call_id: str
    events: list[CallEvent]
    object: str = "duplex.outbound_call"


@dataclass(eq=False)
class PlacedCall:
    target: str
    opening: CallOpening
    id: str = field(default_factory=lambda: f"out_{secrets.token_hex(12)}")
    created: float = field(default_factory=time.monotonic)
    state: PlacedState = PlacedState.CALLING
    sip_status: int | None = None
    reason: str = ""
    events: list[CallEvent] = field(default_factory=list)
    destination: Address | None = None  # where the INVITE went (the trunk, or the target's host)
    call: SipCall | None = None  # the dialog; in the call table once answered
    media: CallMedia | None = None  # held here while ringing, by the call once answered
    invite: ClientTransaction | None = None
    ack: bytes = b""  # our ACK of the 2xx, sent again for each retransmitted 2xx
    offer: bytes = b""
    auth_tried: bool = False
    cancel_wanted: str = ""  # why we cancel (ring timeout, the API); sent once a provisional came
    cancel_sent: bool = False
    ring_timer: asyncio.TimerHandle | None = None
    task: asyncio.Task | None = None

    @property
    def live(self) -> bool:
        return self.state in (PlacedState.CALLING, PlacedState.RINGING, PlacedState.ANSWERED)

    def note(self, kind: str, sip_status: int | None = None, detail: str = "") -> None:
        if len(self.events) >= MAX_EVENTS:  # what a chatty peer can make us keep is bounded
            return
        self.events.append(CallEvent(type=kind, at_s=round(time.monotonic() - self.created, 3),
                                     sip_status=sip_status, detail=detail))

    def view(self) -> PlacedView:
        return PlacedView(id=self.id, to=self.target, state=self.state.value, sip_status=self.sip_status,
                          reason=self.reason, sip_call_id=self.call.call_id if self.call else "",
                          events=list(self.events))

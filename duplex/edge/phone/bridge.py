"""The seam between a phone leg (SIP/RTP or a Twilio stream) and the conversation behind it.

A phone leg knows codecs and timing; a ``CallAgent`` knows the conversation. Every 20 ms the
leg hands the agent the caller's audio and asks it for the agent's next 20 ms; the agent tells
the leg when the caller barged in, so audio queued at the far end can be dropped (`clear`).
What the conversation may ask of the call (hang up, keypad digits out, transfer) the leg offers
with ``CallInfo.control`` (``session/call_control.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from duplex.edge.phone.amd import AmdPolicy, AmdSettings
from duplex.session.call_control import CallControl, NoCallControl
from duplex.session.realtime.events import SessionSettings


@dataclass(frozen=True)
class CallOpening:
    """How a call we placed starts its conversation: the settings the API caller gave (checked
    when the call was asked for) and the line the agent says as soon as the callee answers."""

    settings: SessionSettings | None = None
    first_message: str = ""
    machine: AmdPolicy | None = None  # screen for an answering machine, and what to do if one answers
    machine_settings: AmdSettings | None = None  # the screening's thresholds (None: the defaults)
    report: Callable[[str, int | None, str], None] | None = None  # (kind, SIP status, detail): the placed call's log


@dataclass(frozen=True)
class CallInfo:
    """Who is calling, for the conversation's logs and stats."""

    call_id: str
    transport: str  # "sip" | "twilio"
    caller: str
    callee: str
    extra: dict[str, str] = field(default_factory=dict)
    control: CallControl = field(default_factory=NoCallControl)  # what the leg can do for the agent
    opening: CallOpening | None = None  # an outbound call's own settings; None: the server's


class CallAgent(Protocol):
    input_rate: int  # caller audio arrives as int16 mono at this rate
    output_rate: int  # agent audio leaves as int16 mono at this rate

    def caller_audio(self, pcm: np.ndarray, arrival: float) -> None:
        """The caller's audio (silence where packets were lost), ``arrival`` on the monotonic
        clock."""

    def agent_audio(self, due: float) -> np.ndarray:
        """Exactly one 20 ms frame of agent audio due at ``due`` (zeros while it is quiet)."""

    def dtmf(self, digit: str) -> None:
        """A keypad digit the caller pressed (RFC 4733, SIP INFO or Twilio's ``dtmf``)."""

    def transfer_progress(self, target: str, state: str, status: int | None, detail: str) -> None:
        """A transfer of this call under way, as the far end tells it (accepted, trying, ringing,
        ok, failed), for the conversation's events."""

    def set_barge_in_listener(self, listener: Callable[[], None]) -> None:
        """``listener`` is called when the caller interrupts the agent's speech."""

    async def close(self) -> None:
        """The call ended: free everything the conversation holds."""


AgentFactory = Callable[[CallInfo], Awaitable[CallAgent]]
# Is a session free now, for a call of this transport? Raises AgentUnavailable if not (and
# takes nothing: the session itself is opened by the factory once the call is real).
Reserve = Callable[[str], None]


class AgentUnavailable(Exception):
    """No conversation can be opened now (the server is at its session limit)."""

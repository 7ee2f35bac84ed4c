"""Realtime server events of the call itself (keypad digits both ways, ending, transfer); the
rest are in ``events.py``. ``input_audio_buffer.dtmf_event_received`` is the Realtime API's own
(its SIP calls); the ``duplex.call.*`` ones are ours."""

from __future__ import annotations

from duplex.session.realtime.events import ServerEvent


class DtmfReceived(ServerEvent, kw_only=True, tag="input_audio_buffer.dtmf_event_received"):
    """A keypad digit the caller pressed, as it arrives (the conversation gets it grouped)."""

    event: str  # 0-9, *, #, A-D
    received_at: float  # Unix time, seconds


class DtmfSent(ServerEvent, kw_only=True, tag="duplex.call.dtmf_sent"):
    """Keypad digits queued to the far end (RFC 4733 events on a SIP call's RTP stream)."""

    digits: str
    call_id: str | None = None  # the model's function call that sent them, if it was one


class CallEnding(ServerEvent, kw_only=True, tag="duplex.call.ending"):
    """The call is ending from our side: at once, or once the agent's current reply has played
    (``after_reply``)."""

    reason: str
    after_reply: bool


class TransferDone(ServerEvent, kw_only=True, tag="duplex.call.transfer_result"):
    """How a transfer went: accepted by the far end and, once known, the new leg's status."""

    target: str
    accepted: bool
    status: int | None = None
    detail: str = ""
    call_id: str | None = None  # the model's function call that asked for it, if it was one


class TransferProgress(ServerEvent, kw_only=True, tag="duplex.call.transfer_progress"):
    """A transfer under way as the far end tells it (SIP: the REFER's answer, then NOTIFYs with
    the new call's status): accepted, trying, ringing, then ok or failed."""

    target: str
    state: str  # accepted | trying | ringing | ok | failed
    status: int | None = None  # the SIP status behind it (202, 100, 180, 200, 486 ...)
    detail: str = ""


class AnsweredBy(ServerEvent, kw_only=True, tag="duplex.call.answered_by"):
    """An outbound call's answering-machine detection (``edge/phone/amd.py``): who answered,
    when it was decided (ms from the answer), whether a beep was heard, and why."""

    verdict: str  # human | machine
    decided_ms: int
    beep: bool = False
    reason: str = ""

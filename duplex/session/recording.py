"""A call's recording as the session sees it: whether it is on, the client's ask to turn it on or
off (``session.update`` ``recording``), and the notice a caller with no event channel (a phone)
must hear first. The server's recording policy decides (``server/recording_policy.py``); this
layer knows nothing of files or policies, only the answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from duplex.session.realtime.client_items import ClientTurn

# how a short fixed text is asked of the pipeline: there is no verbatim "say" request in the
# runtime contract, so the notice (and an outbound call's first message) is a response whose
# instructions are to say it and nothing else
NOTICE_INSTRUCTIONS = "Say exactly the following and nothing else: {notice}"


class RecordingRefused(Exception):
    """The client asked for what the policy does not allow; ``code`` goes in the error event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RecordingSwitch(Protocol):
    @property
    def active(self) -> bool:
        """The call is being recorded now (said in session.created / session.updated)."""

    @property
    def notice(self) -> str:
        """What a recorded phone caller hears first."""

    def ask(self, on: bool) -> None:
        """The client asks for the recording on or off; raises RecordingRefused when the policy
        says otherwise (the recording then stays as it was)."""


@dataclass(frozen=True)
class Opening:
    """Who opens a call and what they ask, for the server's watch."""

    owner: str | None = None  # the opener's identity as the edge derives it (never a secret); None: the server
    record: bool | None = None  # the client's ask at open (its settings' ``recording``), if any


class _NotRecorded:
    """No recording on this server: asking for one is refused, asking for none is granted."""

    active = False
    notice = ""

    def ask(self, on: bool) -> None:
        if on:
            raise RecordingRefused("recording_unavailable", "this server does not record calls on request "
                                                            "(its recording policy is not on_request)")


NOT_RECORDED: RecordingSwitch = _NotRecorded()


class SessionRecording:
    """What the session keeps: the call's switch, and the opening settings' ask if it was refused
    (told as an error right after session.created, so that the door's first event stays that one)."""

    def __init__(self, switch: RecordingSwitch = NOT_RECORDED) -> None:
        self.switch = switch
        self.refused: RecordingRefused | None = None

    def open(self, record: bool | None) -> None:
        """The opening settings' ask, granted before session.created describes the call."""
        if record is None:
            return
        try:
            self.switch.ask(record)
        except RecordingRefused as exc:
            self.refused = exc

    @property
    def active(self) -> bool:
        return self.switch.active

    def ask(self, on: bool) -> None:
        self.switch.ask(on)


class _Speaker(Protocol):  # a VoiceSession (which imports this module)
    recording: SessionRecording

    def request_response(self, client: ClientTurn | None = None) -> None: ...


def speak_notice(session: _Speaker, then: str = "") -> None:
    """A recorded call on a door with no event channel says so before anything else: a response
    of its own, asked of the pipeline as a client's ``response.create`` with instructions is.
    ``then``: a line said right after it in the same response (an outbound call's first message:
    one response, as a second one asked while the first plays would be refused)."""
    switch = session.recording.switch
    notice = switch.notice if switch.active else ""
    text = " ".join(line for line in (notice, then.strip()) if line)
    if text:
        session.request_response(ClientTurn(instructions=NOTICE_INSTRUCTIONS.format(notice=text)))

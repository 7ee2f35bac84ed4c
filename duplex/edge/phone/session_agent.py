"""Phone callers talk to the same conversations as browser callers: a ``VoiceSession`` from the
server's ``SessionManager`` (same limit, same stats), with its turn-taking, echo gating and
barge-in, producing audio at G.711's 8 kHz so the phone leg only has to encode it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from duplex.audio import SESSION_RATE
from duplex.edge.phone.bridge import AgentFactory, AgentUnavailable, CallAgent, CallInfo, Reserve
from duplex.edge.phone.screen import NO_BEEP_WAIT_MS, MachineScreen, ScreenStep
from duplex.session.door import AudioClear
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.playout import OutputFormat
from duplex.session.protocol import updated
from duplex.session.realtime import call_events as cev
from duplex.session.realtime import events as ev
from duplex.session.recording import speak_notice

PHONE_OUTPUT = OutputFormat(sample_rate=8000, channels=1, frame_ms=20)
EventObserver = Callable[[CallInfo, ev.ServerEvent], None]


class SessionCallAgent:
    input_rate = SESSION_RATE
    output_rate = PHONE_OUTPUT.sample_rate

    def __init__(self, info: CallInfo, sessions: SessionManager,
                 observer: EventObserver | None = None) -> None:
        self.info = info
        self._sessions = sessions
        self._observer = observer
        self._barge_in_listener: Callable[[], None] | None = None
        self.transport, self.output = info.transport, PHONE_OUTPUT  # the session's door (session/door.py)
        self.control = info.control
        settings = info.opening.settings if info.opening is not None else None
        # an outbound call's settings were checked when it was asked for (``opening_errors``)
        config, tools, choice = updated(sessions.config, settings, [], []) if settings else (None, None, None)
        self.session = sessions.open(self, config, call_id=info.call_id)
        self.session.tools.configure(tools, choice)
        opening = info.opening
        self._first_message = opening.first_message if opening is not None else ""
        self._screen = (MachineScreen(opening.machine, self.input_rate, opening.machine_settings)
                        if opening and opening.machine else None)
        if self._screen is None:  # screened calls speak once they know who answered
            self._speak_first()

    def _speak_first(self) -> None:
        # a phone has no session.created to say it: a recorded call says so first, then the
        # outbound call's first message
        speak_notice(self.session, self._first_message)

    def caller_audio(self, pcm: np.ndarray, arrival: float) -> None:
        screen = self._screen
        if screen is not None:
            step = screen.hear(pcm)
            if step is not None:
                self._screened(screen, step)
            if screen.withholding:  # the conversation must not answer a machine's greeting
                pcm = np.zeros_like(pcm)
        self.session.push_input(pcm, arrival)

    def _screened(self, screen: MachineScreen, step: ScreenStep) -> None:
        decision = screen.decision
        assert decision is not None
        decided = not screen.decision_told
        if decided:  # told once, when decided (a beep already over: decided and leaving at once)
            screen.decision_told = True
            self.session.emit(decision.event())
        report = self.info.opening.report if self.info.opening is not None else None
        if report is not None:
            if decided:
                report(f"answered_by_{decision.verdict.value}", None, decision.reason)
            if step is ScreenStep.LEAVE_MESSAGE:
                report("leaving_message", None, "the beep is over" if screen.detector.beep_end_ms is not None
                       else f"no beep within {NO_BEEP_WAIT_MS} ms")
        if step is ScreenStep.SPEAK:
            self._screen = None
            self._speak_first()
        elif step is ScreenStep.HANG_UP:
            self.session.calls.end("an answering machine answered", after_reply=False)
        elif step is ScreenStep.LEAVE_MESSAGE:
            self._speak_first()
            self.session.calls.end("message left", after_reply=True)

    def agent_audio(self, due: float) -> np.ndarray:
        return self.session.pull_output(due)

    def dtmf(self, digit: str) -> None:
        self.session.calls.keypad(digit)  # to the client at once, to the thinker grouped (call_tools.py)

    def transfer_progress(self, target: str, state: str, status: int | None, detail: str) -> None:
        self.session.emit(cev.TransferProgress(target=target, state=state, status=status, detail=detail))

    def set_barge_in_listener(self, listener: Callable[[], None]) -> None:
        self._barge_in_listener = listener

    async def close(self) -> None:
        await self._sessions.close(self.session)

    def clear_audio(self, why: AudioClear) -> None:
        # a reply paused while the session listens is silenced at the far end as a cut one is
        # (what the far end had queued is dropped; the reply resumes from the session's playout)
        if self._barge_in_listener is not None:
            self._barge_in_listener()

    def deliver(self, event: ev.ServerEvent) -> None:
        if self._observer is not None:
            self._observer(self.info, event)


def opening_errors(sessions: SessionManager, settings: ev.SessionSettings) -> str | None:
    """What is wrong with an outbound call's session settings (None: they apply)."""
    try:
        updated(sessions.config, settings, [], [])
    except ValueError as exc:
        return str(exc)
    return None


def session_agents(sessions: SessionManager, observer: EventObserver | None = None) -> AgentFactory:
    """An agent factory for ``SipServer`` and ``TwilioEndpoint``: one session per call."""

    async def create(info: CallInfo) -> CallAgent:
        try:
            return SessionCallAgent(info, sessions, observer)
        except SessionsFull as exc:
            raise AgentUnavailable(str(exc)) from exc

    return create


def session_reserve(sessions: SessionManager) -> Reserve:
    """For ``SipServer``: is a session free now (486 at the INVITE if not)? Takes none: a SIP
    call opens its session only once its 200 OK is ACKed."""

    def reserve(transport: str) -> None:
        try:
            sessions.reserve(transport)
        except SessionsFull as exc:
            raise AgentUnavailable(str(exc)) from exc

    return reserve

"""One response: its ids, its runtime turn, its state, what it held back, what was heard, timings.

What the response's booleans used to say (audio began, finished, cancelled, over, speculative)
is now its state (``states.ResponseState``); the properties below read it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from duplex.runtime.contract import ErrorCode, StageError, Transcript
from duplex.session.heard import VoicedText
from duplex.session.port import Turn, TurnEnded, TurnEvent, TurnStatus
from duplex.session.states import RESPONSE_TRANSITIONS, IllegalTransition, ResponseState, StateMachine
from duplex.session.turn_timing import TurnBreakdown, TurnTiming

log = logging.getLogger("duplex.session")

# where a reply is held while an overlap is judged, and the state its resume returns to
_RESUMES_TO = {ResponseState.PAUSED: ResponseState.SPEAKING, ResponseState.PAUSED_DRAINING: ResponseState.DRAINING}
_PAUSES_TO = {playing: paused for paused, playing in _RESUMES_TO.items()}
_AUDIO_QUEUED = frozenset(_RESUMES_TO) | frozenset(_PAUSES_TO)
_RUNTIME_ENDED = frozenset({ResponseState.DRAINING, ResponseState.PAUSED_DRAINING, ResponseState.DONE,
                            ResponseState.FAILED})


class Response:
    def __init__(self, turn: Turn, item_id: str, user_item_id: str | None) -> None:
        self.turn = turn
        self.id = "resp_" + item_id.split("_", 1)[1]
        self.item_id = item_id  # the assistant message item its audio and transcript belong to
        self.user_item_id = user_item_id
        self._machine = StateMachine(f"response {self.id}", ResponseState.LISTENING, RESPONSE_TRANSITIONS)
        self.transcript: list[str] = []
        self.held: list[TurnEvent] = []  # outputs waiting for the turn to be committed
        self.played_ms = 0
        self.audio_received_ms = 0.0  # agent audio the runtime delivered (played or not)
        self.voiced = VoicedText()  # which text each chunk of that audio voices (heard.py)
        self.speech_end: float | None = None  # when the turn it answers ended (monotonic)
        self.ttfa_ms: float | None = None
        self.typed = False  # it answers typed text: no input transcription to report
        self.text_only = False  # reply in text only: its audio, if any comes, is dropped
        self.input_words = 0  # of the turn it answers (usage)
        self.timing = TurnTiming()  # when its outputs arrived: the parts of its time to first audio
        self.breakdown: TurnBreakdown | None = None  # those parts, once its first frame went out

    # -- state ----------------------------------------------------------------------------------
    @property
    def state(self) -> ResponseState:
        return self._machine.state

    def move(self, new: ResponseState) -> None:
        self._machine.move(new)
        if self._machine.ended:
            self.held = []  # a response that ends before its turn was committed drops what it held

    @property
    def live(self) -> bool:
        """Something may still be played or produced for it."""
        return not self._machine.ended

    @property
    def committed(self) -> bool:
        """It was announced to the client (response.created): its turn was committed, whatever
        happened since."""
        return self.speech_end is not None

    @property
    def input_open(self) -> bool:
        """The caller's turn still streams into its request."""
        return self.state is ResponseState.LISTENING

    @property
    def speculative(self) -> bool:
        return self.state is ResponseState.SPECULATIVE

    @property
    def audio_began(self) -> bool:
        """Its audio was queued for playout (and it was not stopped since)."""
        return self.state in _AUDIO_QUEUED

    @property
    def paused(self) -> bool:
        """Its audio is held where it stopped while an overlap is judged (``listen.py``)."""
        return self.state in _RESUMES_TO

    def pause(self) -> None:
        """An onset over its playing audio: hold it (speaking or draining, whichever it was)."""
        self.move(self._either(_PAUSES_TO, "playing"))

    def resume(self) -> None:
        """The overlap was no interruption: its audio plays on from where it was held."""
        self.move(self._either(_RESUMES_TO, "paused"))

    def complete(self) -> None:
        """The runtime completed it: what is queued plays out (held on, if it is paused)."""
        self.move({ResponseState.SPEAKING: ResponseState.DRAINING,
                   ResponseState.PAUSED: ResponseState.PAUSED_DRAINING}.get(self.state, ResponseState.DONE))

    def _either(self, moves: dict[ResponseState, ResponseState], what: str) -> ResponseState:
        # pausing and resuming each have two sources: the table alone cannot name the one target
        if self.state not in moves:
            raise IllegalTransition(f"{self._machine.name}: {self.state.value} is not {what}")
        return moves[self.state]

    @property
    def runtime_ended(self) -> bool:
        """The runtime ended it (completed or failed): there is nothing to abort."""
        return self.state in _RUNTIME_ENDED

    def holds(self, event: TurnEvent) -> bool:
        """Whether ``event`` waits for the turn to be committed. A speculation holds everything
        (its transcript too: the caller may speak past it). While the caller speaks, their
        transcript passes and a failure ends the response now; the agent's output waits."""
        if self.state is ResponseState.SPECULATIVE:
            return True
        if self.state is not ResponseState.LISTENING:
            return False
        if isinstance(event, TurnEnded):
            return event.status is TurnStatus.COMPLETED
        return not isinstance(event, Transcript)

    async def consume(self, deliver: Callable[[Response, TurnEvent], None]) -> None:
        """Hand each of its turn's events to ``deliver`` while it is live, up to the end."""
        stream = aiter(self.turn.events())
        while True:
            try:
                event = await anext(stream)
            except StopAsyncIteration:
                return
            except Exception as exc:  # a broken stream fails this response, never the session
                log.exception("response %s: its stream failed", self.id)
                event = TurnEnded(TurnStatus.FAILED, StageError(ErrorCode.INTERNAL, repr(exc)))
            if self.live:
                deliver(self, event)
            if isinstance(event, TurnEnded):
                return

    # -- timings --------------------------------------------------------------------------------
    def commit(self, speech_end: float, now: float | None = None) -> list[TurnEvent]:
        """The turn it answers ended at ``speech_end`` (and was committed ``now``); returns the
        outputs it held, in order."""
        held, self.held = self.held, []
        self.speech_end = speech_end
        self.timing.committed = speech_end if now is None else now
        self.move(ResponseState.COMMITTED)
        return held

    def on_first_audio(self, due: float) -> None:
        if self.speech_end is not None:
            self.breakdown = self.timing.breakdown(self.speech_end, due)
            self.ttfa_ms = self.breakdown.ttfa_ms

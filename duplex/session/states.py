"""The session's state machines, each with its states and legal transitions in one table:
the call's (what the conversation is doing), each response's (where one answer is in its
life) the turn detector's (where the caller's turn is: ``turns.TurnDetector``) and the listening
barge-in's (``overlap.Listening``). Moving to a
state the table does not allow from the current one raises ``IllegalTransition``: that is a bug
in the session, never something a caller can cause."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar


class IllegalTransition(RuntimeError):
    pass


class CallState(str, enum.Enum):
    IDLE = "idle"  # listening; no response is live
    USER_SPEAKING = "user_speaking"  # a caller turn is open (its audio streams to the runtime)
    RESPONDING = "responding"  # a response was announced; none of its audio has played yet
    AGENT_SPEAKING = "agent_speaking"  # the response's audio is playing
    CLOSED = "closed"


CALL_TRANSITIONS: Mapping[CallState, frozenset[CallState]] = {
    CallState.IDLE: frozenset({CallState.USER_SPEAKING, CallState.RESPONDING, CallState.CLOSED}),
    # the turn ends (a response follows), or is dropped (cleared, or its request failed)
    CallState.USER_SPEAKING: frozenset({CallState.RESPONDING, CallState.IDLE, CallState.CLOSED}),
    # first audio played; the response ended or was cancelled; a barge-in opens a turn
    CallState.RESPONDING: frozenset({CallState.AGENT_SPEAKING, CallState.IDLE, CallState.USER_SPEAKING,
                                     CallState.CLOSED}),
    CallState.AGENT_SPEAKING: frozenset({CallState.IDLE, CallState.USER_SPEAKING, CallState.CLOSED}),
    CallState.CLOSED: frozenset(),
}


class ResponseState(str, enum.Enum):
    LISTENING = "listening"  # the caller's turn streams into the request; agent output is held
    SPECULATIVE = "speculative"  # the caller paused: input closed, every output held (preemption)
    COMMITTED = "committed"  # the turn ended: announced (response.created); no audio queued yet
    SPEAKING = "speaking"  # its audio is queued for playout; the runtime still produces
    # an onset paused its audio where it stopped while the overlap is judged (``listen.py``);
    # the runtime still produces: a resume goes back to speaking
    PAUSED = "paused"
    DRAINING = "draining"  # the runtime completed it; the rest of its audio plays out
    PAUSED_DRAINING = "paused_draining"  # paused (or completed while paused): a resume goes back to draining
    DONE = "done"  # completed and all of its audio played (or it had none)
    CANCELLED = "cancelled"  # stopped by us: barge-in, client cancel, superseded, cleared, hang-up
    FAILED = "failed"  # the runtime failed it


_STOPPABLE = frozenset({ResponseState.CANCELLED, ResponseState.FAILED})

RESPONSE_TRANSITIONS: Mapping[ResponseState, frozenset[ResponseState]] = {
    ResponseState.LISTENING: frozenset({ResponseState.SPECULATIVE, ResponseState.COMMITTED}) | _STOPPABLE,
    # the turn ended as the speculation assumed, or the caller spoke again (cancelled)
    ResponseState.SPECULATIVE: frozenset({ResponseState.COMMITTED}) | _STOPPABLE,
    ResponseState.COMMITTED: frozenset({ResponseState.SPEAKING, ResponseState.DONE}) | _STOPPABLE,
    ResponseState.SPEAKING: frozenset({ResponseState.DRAINING, ResponseState.PAUSED}) | _STOPPABLE,
    # resumed; the runtime completed it while paused; interrupted (cancelled) or the runtime failed
    ResponseState.PAUSED: frozenset({ResponseState.SPEAKING, ResponseState.PAUSED_DRAINING}) | _STOPPABLE,
    ResponseState.DRAINING: frozenset({ResponseState.DONE, ResponseState.CANCELLED, ResponseState.PAUSED_DRAINING}),
    # the runtime is done with it: it can no longer fail, only resume or be interrupted
    ResponseState.PAUSED_DRAINING: frozenset({ResponseState.DRAINING, ResponseState.CANCELLED}),
    ResponseState.DONE: frozenset(),
    ResponseState.CANCELLED: frozenset(),
    ResponseState.FAILED: frozenset(),
}


class TurnPhase(str, enum.Enum):
    """Where the caller's turn is, as the turn detector sees it (stream time, per frame)."""

    QUIET = "quiet"  # no turn: voiced frames are counted towards a start
    SPEAKING = "speaking"  # a turn is open; any silence is shorter than every pause cue
    PAUSED = "paused"  # the speculation cue of this pause was reported (the answer may start)
    JUDGED = "judged"  # the judging cue of this pause was reported (is the turn over?)
    PAUSED_JUDGED = "paused_judged"  # both cues of this pause were reported


_PAUSE_ENDS = frozenset({TurnPhase.QUIET, TurnPhase.SPEAKING})  # the turn ends, or voice resumes it

TURN_TRANSITIONS: Mapping[TurnPhase, frozenset[TurnPhase]] = {
    TurnPhase.QUIET: frozenset({TurnPhase.SPEAKING}),
    # silence or the longest turn ends it; a pause gives one cue or both at once
    TurnPhase.SPEAKING: frozenset({TurnPhase.QUIET, TurnPhase.PAUSED, TurnPhase.JUDGED, TurnPhase.PAUSED_JUDGED}),
    TurnPhase.PAUSED: _PAUSE_ENDS | {TurnPhase.PAUSED_JUDGED},
    TurnPhase.JUDGED: _PAUSE_ENDS | {TurnPhase.PAUSED_JUDGED},
    TurnPhase.PAUSED_JUDGED: _PAUSE_ENDS,
}


class ListenPhase(str, enum.Enum):
    """Where the barge-in that listens is (``overlap.Listening``)."""

    IDLE = "idle"  # no reply is paused
    JUDGING = "judging"  # a reply is paused at an onset; the sound is judged frame by frame
    WAITING_WORDS = "waiting_words"  # the sound says resume; the reply stays paused for its final words


LISTEN_TRANSITIONS: Mapping[ListenPhase, frozenset[ListenPhase]] = {
    ListenPhase.IDLE: frozenset({ListenPhase.JUDGING}),
    # settled (or dropped); the sound ended and would resume the reply, but its words are coming
    ListenPhase.JUDGING: frozenset({ListenPhase.IDLE, ListenPhase.WAITING_WORDS}),
    # settled (or dropped); voice again: the sound goes on
    ListenPhase.WAITING_WORDS: frozenset({ListenPhase.IDLE, ListenPhase.JUDGING}),
}

S = TypeVar("S", CallState, ResponseState, TurnPhase, ListenPhase)


class StateMachine(Generic[S]):
    """A current state and the table of where it may go next."""

    def __init__(self, name: str, initial: S, transitions: Mapping[S, frozenset[S]]) -> None:
        self.name = name
        self._state: S = initial
        self._transitions: Mapping[S, frozenset[S]] = transitions

    @property
    def state(self) -> S:
        return self._state

    def allows(self, new: S) -> bool:
        return new in self._transitions[self._state]

    def move(self, new: S) -> None:
        if not self.allows(new):
            raise IllegalTransition(f"{self.name}: {self._state.value} -> {new.value} is not a legal transition")
        self._state = new

    @property
    def ended(self) -> bool:
        return not self._transitions[self._state]

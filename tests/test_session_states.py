"""The session's state machines: every state is reachable, the ends are ends, an illegal move
raises, and a response's derived flags follow its state."""

from __future__ import annotations

import pytest

from duplex.runtime.contract import AgentAudio, AgentText, CallerAudio, Transcript, TurnRequest
from duplex.session.port import TurnEnded, TurnStatus
from duplex.session.response import Response
from duplex.session.states import (
    CALL_TRANSITIONS,
    RESPONSE_TRANSITIONS,
    CallState,
    IllegalTransition,
    ResponseState,
    StateMachine,
)
from tests.session_fakes import FakeTurn

R = ResponseState


def reachable(transitions, start) -> set:
    seen, todo = {start}, [start]
    while todo:
        for nxt in transitions[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reachable_and_only_the_ends_have_no_way_out():
    assert reachable(CALL_TRANSITIONS, CallState.IDLE) == set(CallState)
    assert reachable(RESPONSE_TRANSITIONS, R.LISTENING) == set(ResponseState)
    assert [s for s, nxt in CALL_TRANSITIONS.items() if not nxt] == [CallState.CLOSED]
    assert {s for s, nxt in RESPONSE_TRANSITIONS.items() if not nxt} == {R.DONE, R.CANCELLED, R.FAILED}
    assert all(CallState.CLOSED in nxt for s, nxt in CALL_TRANSITIONS.items() if s is not CallState.CLOSED)


@pytest.mark.parametrize("start, illegal", [
    (CallState.IDLE, CallState.AGENT_SPEAKING),  # audio plays only for an announced response
    (CallState.IDLE, CallState.IDLE),  # staying put is not a transition
    (CallState.USER_SPEAKING, CallState.AGENT_SPEAKING),
    (CallState.CLOSED, CallState.IDLE),
])
def test_an_illegal_call_transition_raises_and_leaves_the_state(start, illegal):
    machine = StateMachine("call", start, CALL_TRANSITIONS)
    with pytest.raises(IllegalTransition, match=f"{start.value} -> {illegal.value}"):
        machine.move(illegal)
    assert machine.state is start


def response_in(*path: ResponseState) -> Response:
    response = Response(FakeTurn(TurnRequest(session_id="s"), "req_1"), "item_x_1", "item_x_0")
    for state in path:
        if state is R.COMMITTED:
            response.commit(speech_end=1.0)
        else:
            response.move(state)
    return response


@pytest.mark.parametrize("path, illegal", [
    ((), R.SPEAKING),  # no audio before the turn is committed
    ((), R.DONE),
    ((R.SPECULATIVE,), R.LISTENING),  # a closed input does not reopen: a fresh request does that
    ((R.COMMITTED,), R.SPECULATIVE),
    ((R.COMMITTED, R.SPEAKING, R.DRAINING), R.FAILED),  # the runtime already completed it
    ((R.COMMITTED, R.DONE), R.CANCELLED),  # nothing left to cancel
    ((R.CANCELLED,), R.COMMITTED),
])
def test_an_illegal_response_transition_raises(path, illegal):
    response = response_in(*path)
    before = response.state
    with pytest.raises(IllegalTransition):
        response.move(illegal)
    assert response.state is before


def test_the_response_flags_are_its_state():
    listening = response_in()
    assert listening.live and listening.input_open and not listening.committed and not listening.speculative
    assert response_in(R.SPECULATIVE).speculative and not response_in(R.SPECULATIVE).input_open
    committed = response_in(R.COMMITTED)
    assert committed.committed and not committed.audio_began and not committed.runtime_ended
    assert response_in(R.COMMITTED, R.SPEAKING).audio_began
    draining = response_in(R.COMMITTED, R.SPEAKING, R.DRAINING)
    assert draining.live and draining.audio_began and draining.runtime_ended
    for ended in (response_in(R.COMMITTED, R.DONE), response_in(R.CANCELLED), response_in(R.COMMITTED, R.FAILED)):
        assert not ended.live and not ended.audio_began
    assert not response_in(R.FAILED).committed  # failed while the caller spoke: never announced


def test_what_a_response_holds_until_its_turn_is_committed():
    audio, text = AgentAudio([0.1], 16000), AgentText("hi")
    interim, done, failed = Transcript("could"), TurnEnded(TurnStatus.COMPLETED), TurnEnded(TurnStatus.FAILED)
    listening = response_in()
    assert [listening.holds(e) for e in (audio, text, interim, done, failed)] == [True, True, False, True, False]
    speculative = response_in(R.SPECULATIVE)
    assert all(speculative.holds(e) for e in (audio, text, interim, done, failed))
    assert not any(response_in(R.COMMITTED).holds(e) for e in (audio, text, interim, done, failed))
    speculative.held.extend([text, audio])
    assert speculative.commit(speech_end=2.0) == [text, audio] and speculative.held == []
    dropped = response_in(R.SPECULATIVE)
    dropped.held.append(CallerAudio([0.0]))
    dropped.move(R.CANCELLED)
    assert dropped.held == []

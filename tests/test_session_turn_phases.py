"""The turn detector's phases (``states.TurnPhase``): its table is whole, a move it does not allow
raises, and frame verdicts walk a detector through the phases its cues say. The detector decides
on stream time, so frames are pushed as voiced/unvoiced verdicts, 20 ms each: no clock, no audio."""

from __future__ import annotations

import itertools

import pytest

from duplex.config.session import VadConfig
from duplex.session.states import TURN_TRANSITIONS, IllegalTransition, StateMachine, TurnPhase
from duplex.session.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, StopReason, TurnDetector

P = TurnPhase
FRAME_MS = 20


def push(detector: TurnDetector, marks: str, start_ms: int = 0, **kwargs: int) -> list:
    """``marks``: one character a frame, "1" voiced, "0" not; the cues in order, with the phase after each."""
    cues = []
    for i, mark in enumerate(marks):
        cue = detector.push(start_ms + i * FRAME_MS, mark == "1", **kwargs)
        if cue is not None:
            cues.append((cue, detector.phase))
    return cues


def test_every_phase_is_reachable_and_every_phase_can_end_the_turn():
    seen, todo = {P.QUIET}, [P.QUIET]
    while todo:
        for nxt in TURN_TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(TurnPhase)
    assert all(P.QUIET in TURN_TRANSITIONS[phase] for phase in TurnPhase if phase is not P.QUIET)


@pytest.mark.parametrize(("start", "illegal"), [
    (start, illegal) for start, illegal in itertools.product(TurnPhase, TurnPhase)
    if illegal not in TURN_TRANSITIONS[start]
])
def test_a_move_the_table_does_not_allow_raises_and_leaves_the_phase(start, illegal):
    machine = StateMachine("turn", start, TURN_TRANSITIONS)
    with pytest.raises(IllegalTransition, match=f"{start.value} -> {illegal.value}"):
        machine.move(illegal)
    assert machine.state is start


def test_a_pause_walks_speaking_paused_judged_then_a_resume_and_the_silence_end():
    config = VadConfig()  # min_speech_ms 80, silence_ms 500
    detector = TurnDetector(config, pause_ms=200, judge_ms=300)
    assert detector.phase is P.QUIET and not detector.speaking
    cues = push(detector, "1" * 10 + "0" * 15 + "1" * 5 + "0" * 25)
    kinds = [(type(cue), phase) for cue, phase in cues]
    assert kinds == [(SpeechStarted, P.SPEAKING),
                     (SpeechPaused, P.PAUSED), (SpeechPaused, P.PAUSED_JUDGED), (SpeechResumed, P.SPEAKING),
                     (SpeechPaused, P.PAUSED), (SpeechPaused, P.PAUSED_JUDGED), (SpeechStopped, P.QUIET)]
    assert [(c.speculate, c.judge) for c, _ in cues if isinstance(c, SpeechPaused)] == [(True, False),
                                                                                         (False, True)] * 2


def test_cues_due_together_are_one_cue_and_one_move():
    detector = TurnDetector(VadConfig(), pause_ms=200, judge_ms=200)
    cues = push(detector, "1" * 10 + "0" * 10)
    assert [(type(c), phase) for c, phase in cues] == [(SpeechStarted, P.SPEAKING), (SpeechPaused, P.PAUSED_JUDGED)]
    assert detector.paused and detector.judged and detector.pause_end_ms == 200


def test_judging_alone_goes_through_judged_and_a_judged_end_leaves_quiet():
    detector = TurnDetector(VadConfig(), judge_ms=200, silence_ms=2000)
    cues = push(detector, "1" * 10 + "0" * 10)
    assert [phase for _, phase in cues] == [P.SPEAKING, P.JUDGED]
    assert detector.judged and not detector.paused
    assert detector.end_now(pause_end_ms=999) is None and detector.phase is P.JUDGED  # not this pause
    stop = detector.end_now(pause_end_ms=200)
    assert stop == SpeechStopped(end_ms=200, reason=StopReason.JUDGED) and detector.phase is P.QUIET
    assert detector.end_now(pause_end_ms=200) is None  # a quiet detector has no pause to end


def test_the_voiced_audio_that_starts_a_turn_is_given_with_each_frame():
    """The session asks less voice of a start while a reply that would only pause is live: the
    threshold comes with the frame (default ``vad.min_speech_ms``), nothing is left set between frames."""
    config = VadConfig()
    default, quick = TurnDetector(config), TurnDetector(config)
    started_default = push(default, "1" * 5)
    started_quick = push(quick, "1" * 5, min_speech_ms=40)
    assert started_default[0][0] == SpeechStarted(onset_ms=0)
    assert started_quick[0][0] == SpeechStarted(onset_ms=0)
    # the default needs 80 ms: the 4th frame; 40 ms: the 2nd
    assert [len(push(TurnDetector(config), "1" * n)) for n in (3, 4)] == [0, 1]
    assert [len(push(TurnDetector(config), "1" * n, min_speech_ms=40)) for n in (1, 2)] == [0, 1]
    assert not hasattr(default, "min_speech_ms")


def test_reset_and_carry_on_move_from_any_phase():
    detector = TurnDetector(VadConfig(), pause_ms=200)
    detector.reset()  # quiet stays quiet
    assert detector.phase is P.QUIET
    push(detector, "1" * 10 + "0" * 10)
    assert detector.phase is P.PAUSED
    detector.carry_on(onset_ms=0, last_voiced_end_ms=200, now_ms=400)
    assert detector.phase is P.SPEAKING and detector.pause_end_ms is None
    detector.carry_on(onset_ms=0, last_voiced_end_ms=200, now_ms=400)  # speaking stays speaking
    assert detector.phase is P.SPEAKING
    detector.reset()
    assert detector.phase is P.QUIET
    detector.carry_on(onset_ms=0, last_voiced_end_ms=200, now_ms=400)  # an interruption's turn from quiet
    assert detector.phase is P.SPEAKING
    # the silence since the voice's end counted: 300 ms more of it ends the turn (silence_ms 500)
    cues = push(detector, "0" * 15, start_ms=400)
    assert isinstance(cues[-1][0], SpeechStopped) and cues[-1][0].end_ms == 200

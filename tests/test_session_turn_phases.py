"""The turn detector's phases (``states.TurnPhase``), the listening barge-in's
(``states.ListenPhase``) and a reply's pause while an overlap is judged (``ResponseState.PAUSED``):
each table is whole, a move it does not allow raises, and frame verdicts walk each through the
phases they say. The detector decides on stream time, so frames are pushed as voiced/unvoiced
verdicts, 20 ms each: no clock, no audio. Last, a session in process: its reply is paused while
judged, and an onset-mode barge-in is an overlap verdict like any other."""

from __future__ import annotations

import itertools

import pytest

from duplex.config.session import BargeInConfig, VadConfig
from duplex.runtime.contract import Transcript, TurnRequest
from duplex.session.door import AudioClear
from duplex.session.overlap import Listening, OverlapJudge, OverlapKind, OverlapVerdict
from duplex.session.realtime import events as ev
from duplex.session.response import Response
from duplex.session.states import (
    LISTEN_TRANSITIONS,
    RESPONSE_TRANSITIONS,
    TURN_TRANSITIONS,
    IllegalTransition,
    ListenPhase,
    ResponseState,
    StateMachine,
    TurnPhase,
)
from duplex.session.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, StopReason, TurnDetector
from tests.session_fakes import Call, FakeTurn, words
from tests.test_session_call import ONSET, SILENCE_MS, answering

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


def test_a_lone_voiced_frame_in_a_pause_neither_ends_it_nor_lengthens_it():
    """A steady noise's peak that clears the gate (one frame, or three) is no caller: the pause goes
    on and the turn ends at its silence, one frame later per such frame; with the resume bar at one
    frame it would break the pause each time, and the turn would never end."""
    speech, gap, lone = "1" * 10, "0" * 14, "1"
    marks = speech + (gap + lone) * 7 + "0" * 30  # a voiced frame every 300 ms of a 2 s silence
    cues = push(TurnDetector(VadConfig(), silence_ms=2000), marks)
    assert [type(c) for c, _ in cues] == [SpeechStarted, SpeechStopped]
    detector = TurnDetector(VadConfig(), silence_ms=2000)
    stopped_at = next(i for i, mark in enumerate(marks) if isinstance(detector.push(i * FRAME_MS, mark == "1"),
                                                                       SpeechStopped))
    assert stopped_at == len(speech) + 2000 // FRAME_MS + 7 - 1  # the silence's 100 frames and the 7 lone ones
    assert cues[1][0].end_ms == len(speech) * FRAME_MS  # the turn's end is the speech's
    three = speech + ("0" * 10 + "111") * 8 + "0" * 120
    assert [type(c) for c, _ in push(TurnDetector(VadConfig(), silence_ms=2000), three)] == [SpeechStarted,
                                                                                               SpeechStopped]
    every_frame = push(TurnDetector(VadConfig(resume_speech_ms=20), silence_ms=2000), marks)
    assert [type(c) for c, _ in every_frame] == [SpeechStarted]


def test_a_word_after_a_pause_resumes_from_its_first_frame_and_does_not_lengthen_the_pause():
    detector = TurnDetector(VadConfig(), pause_ms=100, silence_ms=2000)
    cues = push(detector, "1" * 10 + "000" + "1" * 8 + "0" * 5 + "1" * 8)
    # 60 ms between words: no pause; the word's first frames, before it is voice enough, count for neither
    assert [type(c) for c, _ in cues] == [SpeechStarted, SpeechPaused, SpeechResumed]
    assert cues[2][0].at_ms == (10 + 3 + 8 + 5) * FRAME_MS  # the first voiced frame after the pause


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


# -- the listening barge-in's phases (overlap.Listening) --------------------------------------------
def _listening(words_coming: bool = True) -> Listening[str]:
    heard: Listening[str] = Listening()
    assert heard.phase is ListenPhase.IDLE and not heard.active
    heard.begin(OverlapJudge(BargeInConfig(), onset_ms=1000, now_ms=1080, voiced_ms=80), "reply", words_coming)
    return heard


def _frames(heard: Listening[str], marks: str) -> list:
    return [heard.push(FRAME_MS, mark == "1") for mark in marks]


def test_the_listening_table_is_whole_and_refuses_what_it_does_not_list():
    assert all(ListenPhase.IDLE in LISTEN_TRANSITIONS[p] for p in ListenPhase if p is not ListenPhase.IDLE)
    assert set().union(*LISTEN_TRANSITIONS.values()) == set(ListenPhase)
    machine = StateMachine("listening", ListenPhase.IDLE, LISTEN_TRANSITIONS)
    with pytest.raises(IllegalTransition, match="idle -> waiting_words"):
        machine.move(ListenPhase.WAITING_WORDS)


def test_a_sound_that_ends_waits_for_its_words_goes_on_when_voice_comes_back_and_settles_idle():
    resume_frames = BargeInConfig().resume_ms // FRAME_MS
    heard = _listening()
    assert heard.phase is ListenPhase.JUDGING
    assert _frames(heard, "1" * 5 + "0" * resume_frames) == [None] * (5 + resume_frames)
    assert heard.phase is ListenPhase.WAITING_WORDS and heard.waiting_words  # the sound says resume
    assert _frames(heard, "1") == [None] and heard.phase is ListenPhase.JUDGING  # ... but it goes on
    verdict, reply = heard.heard(Transcript("Stop", final=False))
    assert verdict.interrupts and reply == "reply" and heard.phase is ListenPhase.IDLE
    heard.drop()  # nothing to drop: it stays idle
    assert heard.phase is ListenPhase.IDLE


def test_without_words_the_sound_settles_straight_from_judging_and_a_second_begin_is_refused():
    resume_frames = BargeInConfig().resume_ms // FRAME_MS
    heard = _listening(words_coming=False)
    phases = []
    for mark in "1" * 5 + "0" * resume_frames:
        settled = heard.push(FRAME_MS, mark == "1")
        phases.append(heard.phase)
    assert settled is not None and settled[0].kind is OverlapKind.NOISE  # 180 ms voiced: under noise_ms
    assert phases == [ListenPhase.JUDGING] * (4 + resume_frames) + [ListenPhase.IDLE]  # never waiting
    heard = _listening()
    with pytest.raises(IllegalTransition, match="judging -> judging"):
        heard.begin(OverlapJudge(BargeInConfig(), onset_ms=2000, now_ms=2080, voiced_ms=80), "another")
    heard.drop()
    assert heard.phase is ListenPhase.IDLE and heard.judge is None


# -- a reply paused while an overlap is judged (ResponseState.PAUSED) -------------------------------
R = ResponseState
REPLY = ["this", "is", "a", "long", "answer", "to", "your", "question", "told", "at", "some", "length"]


def _playing(*then: ResponseState) -> Response:
    """A response whose audio is queued (speaking), moved on through ``then``."""
    response = Response(FakeTurn(TurnRequest(session_id="s"), "req_1"), "item_x_1", "item_x_0")
    response.commit(speech_end=1.0)
    response.move(R.SPEAKING)
    for state in then:
        response.move(state)
    return response


def test_a_paused_reply_resumes_to_speaking_or_draining_whichever_it_was():
    speaking = _playing()
    speaking.pause()
    assert speaking.state is R.PAUSED and speaking.paused and speaking.audio_began and speaking.live
    assert not speaking.runtime_ended  # the runtime still produces: it may still fail
    speaking.resume()
    assert speaking.state is R.SPEAKING and not speaking.paused
    draining = _playing(R.DRAINING)
    draining.pause()
    assert draining.state is R.PAUSED_DRAINING and draining.paused and draining.runtime_ended
    draining.resume()
    assert draining.state is R.DRAINING


def test_the_runtime_completing_a_paused_reply_keeps_it_paused_until_the_resume():
    reply = _playing()
    reply.pause()
    reply.complete()
    assert reply.state is R.PAUSED_DRAINING and reply.paused
    reply.resume()
    assert reply.state is R.DRAINING


@pytest.mark.parametrize("paused", [R.PAUSED, R.PAUSED_DRAINING])
def test_an_interruption_cancels_a_paused_reply(paused):
    reply = _playing(R.DRAINING) if paused is R.PAUSED_DRAINING else _playing()
    reply.pause()
    reply.move(R.CANCELLED)
    assert reply.state is R.CANCELLED and not reply.live and not reply.paused


def test_resuming_a_reply_that_is_not_paused_or_pausing_one_that_is_not_playing_raises():
    speaking = _playing()
    with pytest.raises(IllegalTransition, match="speaking is not paused"):
        speaking.resume()
    assert speaking.state is R.SPEAKING
    committed = Response(FakeTurn(TurnRequest(session_id="s"), "req_1"), "item_x_1", "item_x_0")
    committed.commit(speech_end=1.0)
    with pytest.raises(IllegalTransition, match="committed is not playing"):
        committed.pause()  # no audio yet: nothing to hold
    paused = _playing(R.PAUSED)
    with pytest.raises(IllegalTransition, match="paused is not playing"):
        paused.pause()


@pytest.mark.parametrize(("start", "illegal"), [
    (R.PAUSED, R.DONE),  # held audio never plays out while paused
    (R.PAUSED, R.DRAINING),  # a resume returns it to speaking; completing it keeps it paused
    (R.PAUSED_DRAINING, R.SPEAKING),  # the runtime is done with it
    (R.PAUSED_DRAINING, R.FAILED),
    (R.COMMITTED, R.PAUSED),  # no audio queued: nothing to hold
])
def test_the_paused_states_refuse_what_the_table_does_not_list(start, illegal):
    assert illegal not in RESPONSE_TRANSITIONS[start]
    machine = StateMachine("response", start, RESPONSE_TRANSITIONS)
    with pytest.raises(IllegalTransition, match=f"{start.value} -> {illegal.value}"):
        machine.move(illegal)


async def test_a_listening_barge_in_pauses_the_reply_in_its_state_and_a_backchannel_resumes_it():
    call = Call()
    await answering(call, *REPLY, complete=False)
    reply = call.session.response
    assert reply is not None and reply.state is R.SPEAKING
    await call.say(words("okay"))
    assert call.of_type(ev.ResponsePaused) and reply.state is R.PAUSED and call.session.listener.active
    assert call.clears == [AudioClear.PAUSED]  # the door is told by a typed signal, not a wire event
    call.runtime.last.complete()  # the runtime finishes it while it is judged
    await call.quiet(BargeInConfig().resume_ms + 2 * FRAME_MS)
    assert call.of_type(ev.ResponseResumed) and reply.state is R.DRAINING and not call.session.listener.active


async def test_an_onset_mode_barge_in_is_an_interruption_verdict_acted_on_like_a_judged_one():
    call = Call(ONSET)
    acted: list[OverlapVerdict] = []
    act = call.session.interrupted_by

    def spy(verdict: OverlapVerdict, response: Response) -> None:
        acted.append(verdict)
        act(verdict, response)

    call.session.interrupted_by = spy  # type: ignore[method-assign]  # a spy: the real one acts
    await answering(call, *REPLY, complete=False)
    first = call.runtime.last
    await call.say(words("wait I would like tea"))
    await call.quiet(SILENCE_MS)
    started = call.of_type(ev.SpeechStarted)[1]
    assert len(acted) == 1
    verdict = acted[0]
    assert verdict.kind is OverlapKind.INTERRUPTION and verdict.interrupts and verdict.words is None
    assert verdict.at_onset and verdict.onset_ms == started.audio_start_ms and verdict.span_ms > 0
    assert first.aborted and not call.of_type(ev.ResponsePaused) and not call.of_type(ev.OverlapJudged)
    assert call.session.stats()["barge_ins"] == 1 and call.session.stats()["resumed"] == 0
    assert call.clears == [AudioClear.CUT]

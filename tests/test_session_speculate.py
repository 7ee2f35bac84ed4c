"""Speculating sooner than the judgement (``semantic.speculate_ms`` < ``check_ms``), in process: a
session on a fake clock and a scripted runtime, the end-of-turn model answering when the test
says. The answer starts at the shorter pause, so it is under way when the judge says complete;
the judgement still comes at ``check_ms``; a caller who speaks again between the two drops the
speculation (aborted, superseded, nothing judged) and the turn goes on as one."""

from __future__ import annotations

import msgspec
import pytest

from duplex.config.session import SemanticTurnConfig, SessionConfig, VadConfig
from duplex.session.protocol import apply_settings, describe_session
from duplex.session.realtime import events as ev
from duplex.session.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetector
from tests.session_fakes import FRAME_MS, Call, words
from tests.test_session_endpoint import ScriptedModel, judged

SPECULATE_MS, CHECK_MS = 100, 200
EARLY = SessionConfig(turn_detection="semantic_vad",
                      semantic=SemanticTurnConfig(check_ms=CHECK_MS, speculate_ms=SPECULATE_MS))


def _cues(detector: TurnDetector, voiced: list[bool]) -> list[tuple[int, object]]:
    """(frame start ms, cue) for each cue a run of per-frame verdicts gives."""
    cues = []
    for index, is_voiced in enumerate(voiced):
        cue = detector.push(index * FRAME_MS, is_voiced)
        if cue is not None:
            cues.append((index * FRAME_MS, cue))
    return cues


def test_the_detector_cues_the_speculation_then_the_judgement_once_each():
    speech, frames = [True] * 10, lambda ms: ms // FRAME_MS
    detector = TurnDetector.for_session(EARLY)
    cues = _cues(detector, speech + [False] * frames(CHECK_MS + 100))
    (_, started), (spec_at, speculate), (judge_at, judge) = cues
    assert isinstance(started, SpeechStarted)
    assert speculate == SpeechPaused(end_ms=200, speculate=True, judge=False)
    assert judge == SpeechPaused(end_ms=200, speculate=False, judge=True)
    # each cue comes on the frame that completes its pause (frame start + one frame = pause end)
    assert (spec_at + FRAME_MS - 200, judge_at + FRAME_MS - 200) == (SPECULATE_MS, CHECK_MS)
    assert detector.pause_end_ms == 200  # the pause can still be judged complete
    # equal pauses: one cue that does both (what semantic turns did before speculate_ms)
    same = TurnDetector.for_session(SessionConfig(turn_detection="semantic_vad"))
    pauses = [cue for _, cue in _cues(same, speech + [False] * frames(CHECK_MS + 100)) if isinstance(cue, SpeechPaused)]
    assert pauses == [SpeechPaused(end_ms=200, speculate=True, judge=True)]
    # server_vad turns are never judged
    plain = TurnDetector(VadConfig(), pause_ms=200)
    pauses = [cue for _, cue in _cues(plain, speech + [False] * frames(300)) if isinstance(cue, SpeechPaused)]
    assert pauses == [SpeechPaused(end_ms=200, speculate=True, judge=False)]


def test_voice_after_the_speculation_cue_alone_is_a_resume_and_the_next_pause_cues_afresh():
    speech = [True] * 10
    detector = TurnDetector.for_session(EARLY)
    gap = [False] * (SPECULATE_MS // FRAME_MS + 1)  # past the speculation, short of the judgement
    cues = [cue for _, cue in _cues(detector, speech + gap + speech + [False] * (CHECK_MS // FRAME_MS))]
    kinds = [type(cue) for cue in cues]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechPaused]
    assert [(c.speculate, c.judge) for c in cues if isinstance(c, SpeechPaused)] == [(True, False), (True, False),
                                                                                     (False, True)]
    assert not any(isinstance(cue, SpeechStopped) for cue in cues)


async def _speak_until_speculated(call: Call, text: str = "i would like a tea") -> None:
    await call.quiet(400)
    await call.say(words(text))
    for _ in range(CHECK_MS // FRAME_MS):
        if call.of_type(ev.PreemptiveStarted):
            return
        await call.quiet(FRAME_MS)
    raise AssertionError(f"no speculation within the check pause: {call.types()}")


async def test_the_answer_starts_at_the_shorter_pause_and_the_judgement_releases_it():
    model = ScriptedModel()
    call = Call(EARLY, turn_end=model)
    await _speak_until_speculated(call)
    speculation = call.runtime.last
    started = call.of_type(ev.PreemptiveStarted)[0]
    assert speculation.eos and not model.asked  # under way before the turn is judged
    speculation.say("sure")
    await call.settle()
    assert not call.of_type(ev.ResponseCreated)  # held: the turn is not over
    for _ in range((CHECK_MS - SPECULATE_MS) // FRAME_MS + 1):
        if model.asked:
            break
        await call.quiet(FRAME_MS)
    assert model.asked and call.stream_ms - started.audio_end_ms >= CHECK_MS  # judged at check_ms, not sooner
    model.answer(0.9)
    judgement = await judged(call)
    assert judgement.complete and judgement.audio_end_ms == started.audio_end_ms
    assert len(call.of_type(ev.PreemptiveCommitted)) == 1 and len(call.of_type(ev.ResponseCreated)) == 1
    assert len(call.runtime.turns) == 1  # the speculated answer is the reply: nothing started twice


async def test_speech_between_the_speculation_and_the_judgement_drops_the_speculation_and_asks_nothing():
    model = ScriptedModel()
    call = Call(EARLY, turn_end=model)
    await _speak_until_speculated(call, "i would like a large")
    first = call.runtime.last
    await call.say(words("mango tea"))  # the caller goes on before the check pause
    assert first.aborted and len(call.of_type(ev.PreemptiveCancelled)) == 1 and not model.asked
    second = call.runtime.last
    assert second is not first and first.request_id in second.request.supersedes
    assert second.fed_ms >= first.fed_ms  # the fresh request holds the whole turn so far
    assert call.session.response.turn is second and not call.session.response.held
    for _ in range(CHECK_MS // FRAME_MS + 1):
        if model.asked:
            break
        await call.quiet(FRAME_MS)
    model.answer(0.9)
    assert (await judged(call)).complete
    assert len(call.of_type(ev.ResponseCreated)) == 1 and call.session.response.turn is second


def test_speculate_ms_from_the_pipeline_and_from_session_update():
    assert EARLY.pause_ms == SPECULATE_MS and EARLY.judge_ms == CHECK_MS
    default = SessionConfig(turn_detection="semantic_vad")
    assert default.pause_ms == default.judge_ms == default.semantic.check_ms  # as before: one pause
    assert SessionConfig().judge_ms is None
    with pytest.raises(ValueError, match="speculate_ms"):
        SemanticTurnConfig(check_ms=150, speculate_ms=200)
    config = apply_settings(SessionConfig(), _settings({"turn_detection": {"type": "semantic_vad",
                                                                           "speculate_ms": 80}}))
    assert config.pause_ms == 80 and config.judge_ms == CHECK_MS
    with pytest.raises(ValueError, match="speculate_ms applies to semantic_vad"):
        apply_settings(SessionConfig(), _settings({"turn_detection": {"type": "server_vad", "speculate_ms": 80}}))
    with pytest.raises(ValueError, match="semantic.speculate_ms"):
        apply_settings(SessionConfig(), _settings({"turn_detection": {"type": "semantic_vad", "speculate_ms": 900}}))
    call = Call(config)
    assert describe_session(call.session, "m")["audio"]["input"]["turn_detection"]["speculate_ms"] == 80


def _settings(session: dict):
    return msgspec.json.decode(msgspec.json.encode({"type": "session.update", "session": session}),
                               type=ev.SessionUpdate).session

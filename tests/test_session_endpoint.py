"""Semantic end of turn (``turn_detection: semantic_vad``), in process: a session on a fake clock
and a scripted runtime, with an end-of-turn model whose answers the test gives. A pause of
``check_ms`` is judged; complete ends the turn there (the speculative answer is released), not
complete waits up to the longest pause; words that hang veto the model; a verdict that arrives
after the caller spoke again counts for nothing."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from duplex.config.session import EAGERNESS, SemanticTurnConfig, SessionConfig
from duplex.session.endpoint import words_hang
from duplex.session.protocol import apply_settings, describe_session, handle_client_message
from duplex.session.realtime import events as ev
from duplex.session.turns import TurnDetector
from tests.session_fakes import FRAME_MS, Call, words

SEMANTIC = SessionConfig(turn_detection="semantic_vad")
CHECK_MS = SEMANTIC.semantic.check_ms
LONGEST_MS = SEMANTIC.semantic.longest_pause_ms
LOOP_STEPS = 50  # a bound on the event-loop steps a verdict takes to reach the session (it takes a few)


class ScriptedModel:
    """An end-of-turn model that answers when the test says (``answer``), recording each question."""

    def __init__(self) -> None:
        self.asked: list[np.ndarray] = []
        self.prepared = 0
        self._answers: list[asyncio.Future[float]] = []

    def prepare(self) -> None:
        self.prepared += 1

    async def complete_probability(self, audio: np.ndarray) -> float:
        self.asked.append(audio)
        answer: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._answers.append(answer)
        return await answer

    def answer(self, probability: float) -> None:
        self._answers[-1].set_result(probability)


async def judged(call: Call, count: int = 1) -> ev.TurnJudged:
    for _ in range(LOOP_STEPS):
        if len(call.of_type(ev.TurnJudged)) >= count:
            return call.of_type(ev.TurnJudged)[-1]
        await asyncio.sleep(0)  # one loop step: the model's answer travels through the session's task
    raise AssertionError(f"no judgement reached the session: {call.types()}")


async def speak_then_pause(call: Call, model: ScriptedModel, text: str = "i would like a tea") -> int:
    """Lead-in, the words, then the check pause: returns the stream time of the question."""
    await call.quiet(400)
    await call.say(words(text))
    for _ in range((CHECK_MS + 200) // FRAME_MS):
        if model.asked:
            break
        await call.quiet(FRAME_MS)
    assert model.asked, "the pause was never judged"
    return call.stream_ms


async def test_a_pause_judged_complete_ends_the_turn_there_and_releases_the_held_answer():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    asked_at = await speak_then_pause(call, model)
    speculation = call.runtime.last
    assert speculation.eos and len(call.of_type(ev.PreemptiveStarted)) == 1  # the answer started at the pause
    assert model.asked[0].size >= words("i would like a tea").size  # the whole turn, lead-in prefix too
    speculation.say("sure")  # held: the turn is not over yet
    await call.settle()
    assert not call.of_type(ev.ResponseCreated)
    model.answer(0.9)
    judgement = await judged(call)
    assert judgement.complete and judgement.probability == 0.9 and not judgement.words_hang
    stopped = call.of_type(ev.SpeechStopped)[0]
    assert stopped.audio_end_ms == judgement.audio_end_ms
    assert call.stream_ms - asked_at < FRAME_MS * 2  # ended as the verdict came, not at a silence
    assert len(call.of_type(ev.PreemptiveCommitted)) == 1 and len(call.of_type(ev.ResponseCreated)) == 1
    assert call.session.counters.judged_complete == 1 and len(call.runtime.turns) == 1


async def test_a_pause_judged_incomplete_waits_for_the_longest_pause():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model)
    end_of_speech = call.session.detector.pause_end_ms
    model.answer(0.1)
    judgement = await judged(call)
    assert not judgement.complete
    await call.quiet(SEMANTIC.vad.silence_ms * 2)  # twice the plain VAD's silence: still the caller's turn
    assert not call.of_type(ev.SpeechStopped)
    await call.quiet(LONGEST_MS)
    stopped = call.of_type(ev.SpeechStopped)
    assert len(stopped) == 1 and stopped[0].audio_end_ms == end_of_speech
    assert call.session.counters.judged_incomplete == 1


async def test_words_that_hang_veto_a_complete_sound():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model, "i would like a large um")
    call.runtime.last.transcript("I would like a large, um")  # the speculation's ASR: held, but read
    await call.settle()
    model.answer(0.95)
    judgement = await judged(call)
    assert judgement.words_hang and not judgement.complete and not call.of_type(ev.SpeechStopped)


async def test_a_verdict_after_the_caller_spoke_again_counts_for_nothing():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model)
    await call.say(words("with milk"))  # the caller goes on before the model answers
    assert len(call.of_type(ev.PreemptiveCancelled)) == 1
    model.answer(0.99)
    for _ in range(LOOP_STEPS):
        await asyncio.sleep(0)
    assert not call.of_type(ev.TurnJudged) and not call.of_type(ev.SpeechStopped)
    assert call.session.detector.speaking  # the turn goes on, and its next pause is judged afresh
    await call.quiet(CHECK_MS + FRAME_MS)
    assert len(model.asked) == 2


async def test_without_a_model_the_words_alone_judge_at_the_check_pause():
    call = Call(SEMANTIC)
    await call.quiet(400)
    await call.say(words("i would like a tea"))
    await call.quiet(CHECK_MS + FRAME_MS)
    judgement = call.of_type(ev.TurnJudged)[0]
    assert judgement.complete and judgement.probability is None
    assert len(call.of_type(ev.SpeechStopped)) == 1


def test_the_last_word_rule():
    assert words_hang("I would like a large, um") and words_hang("can you book a table for")
    assert words_hang("my name is") and not words_hang("my name is Anna.")
    assert not words_hang("") and not words_hang("I'll take that")
    # a question the ASR wrote as one may end on a preposition or a verb, not on an article or filler
    assert not words_hang("Could you tell me what time it is?") and not words_hang("Who is it for?")
    assert not words_hang("What would you like?") and words_hang("Can I get a?") and words_hang("And, um?")


def test_words_that_trail_off_hang():
    assert words_hang("I would like to order a large...") and words_hang("so I was thinking\u2026")
    assert words_hang('he said "wait..."') and not words_hang("I'd like a large.")


def test_semantic_settings_from_session_update_and_what_the_session_says_of_them():
    config = apply_settings(SessionConfig(), _settings({"turn_detection": {"type": "semantic_vad",
                                                                           "eagerness": "low"}}))
    assert config.semantic_turns and config.semantic.eagerness == "low"
    assert (config.semantic.complete_at, config.silence_ms) == EAGERNESS["low"]
    assert config.pause_ms == config.semantic.check_ms  # the check pause speculates too
    assert TurnDetector.for_session(config).silence_ms == EAGERNESS["low"][1]
    assert apply_settings(config, _settings({"turn_detection": {"type": "server_vad"}})).silence_ms == 500
    with pytest.raises(ValueError, match="eagerness applies to semantic_vad"):
        apply_settings(SessionConfig(), _settings({"turn_detection": {"type": "server_vad", "eagerness": "low"}}))
    with pytest.raises(ValueError, match="check_ms"):
        SessionConfig(turn_detection="semantic_vad", semantic=SemanticTurnConfig(check_ms=1500, max_silence_ms=1000))
    model = ScriptedModel()
    call = Call(turn_end=model)
    handle_client_message(call.session, '{"type": "session.update", "session": {"turn_detection": '
                                        '{"type": "semantic_vad", "eagerness": "sideways"}}}', "m")
    assert call.of_type(ev.ErrorEvent) and not call.session.config.semantic_turns
    handle_client_message(call.session, '{"type": "session.update", "session": {"turn_detection": '
                                        '{"type": "semantic_vad", "eagerness": "high"}}}', "m")
    assert call.session.config.semantic_turns and model.prepared == 1  # the model loads once it is wanted
    described = describe_session(call.session, "m")["audio"]["input"]["turn_detection"]
    assert described["type"] == "semantic_vad" and described["eagerness"] == "high"


def _settings(session: dict):
    return msgspec.json.decode(msgspec.json.encode({"type": "session.update", "session": session}),
                               type=ev.SessionUpdate).session

"""The words a semantic judgement reads are those of the pause judged (in process: fake clock,
scripted runtime, an end-of-turn model answering when the test says). An interim transcript lags
the voice and often ends mid-sentence ("... a tea with"); where the pipeline transcribes, the
verdict waits for the speculation's final transcript, which covers the turn up to the pause."""

from __future__ import annotations

import asyncio

from duplex.config.session import SessionConfig
from duplex.session.realtime import events as ev
from tests.session_fakes import Call, words
from tests.test_session_endpoint import LOOP_STEPS, ScriptedModel, judged, speak_then_pause

SEMANTIC = SessionConfig(turn_detection="semantic_vad")


async def _steps() -> None:
    for _ in range(LOOP_STEPS):
        await asyncio.sleep(0)


async def _judged_by_sound_before_the_words(spoken: str, interim: str, probability: float,
                                            config: SessionConfig = SEMANTIC):
    """A pause whose speculation had only ``interim`` words when the model answered ``probability``."""
    model = ScriptedModel()
    call = Call(config, turn_end=model)
    await speak_then_pause(call, model, spoken)
    speculation = call.runtime.last
    speculation.transcript(interim, final=False)
    await call.settle()
    model.answer(probability)
    await _steps()
    return call, speculation


async def test_a_stale_interim_that_ends_on_a_hanging_word_does_not_veto_a_finished_turn():
    # the interim is a partial from before the end
    call, speculation = await _judged_by_sound_before_the_words("i would like a tea with milk",
                                                                 "I would like a tea with", 0.9)
    assert not call.of_type(ev.TurnJudged) and not call.of_type(ev.SpeechStopped)  # waits for the final words
    speculation.transcript("I would like a tea with milk.")
    judgement = await judged(call)
    assert judgement.complete and not judgement.words_hang and judgement.probability == 0.9
    assert len(call.of_type(ev.SpeechStopped)) == 1 and len(call.of_type(ev.ResponseCreated)) == 1


async def test_the_final_words_of_the_pause_still_veto():
    call, speculation = await _judged_by_sound_before_the_words("i would like a large um", "I would like a", 0.95)
    speculation.transcript("I would like a large, um")
    judgement = await judged(call)
    assert judgement.words_hang and not judgement.complete and not call.of_type(ev.SpeechStopped)


async def test_a_final_that_came_before_the_verdict_is_read_at_once():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model)
    speculation = call.runtime.last
    speculation.transcript("I would like a", final=False)
    speculation.transcript("I would like a tea.")
    await call.settle()
    model.answer(0.9)
    assert (await judged(call)).complete


async def test_without_transcripts_the_sound_alone_decides_at_once():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model)
    model.answer(0.9)
    judgement = await judged(call)  # no transcript ever came: nothing to wait for
    assert judgement.complete and len(call.of_type(ev.SpeechStopped)) == 1


async def test_a_verdict_waiting_for_words_is_dropped_when_the_caller_speaks_again():
    model = ScriptedModel()
    call = Call(SEMANTIC, turn_end=model)
    await speak_then_pause(call, model, "i would like a")
    first = call.runtime.last
    first.transcript("I would", final=False)
    await call.settle()
    model.answer(0.9)
    await _steps()
    await call.say(words("tea"))  # the caller goes on: the waiting verdict is void
    assert first.aborted and not call.of_type(ev.TurnJudged)
    second = call.runtime.last
    second.transcript("I would like a tea.")  # the next pause's words: no verdict of the old pause is settled by them
    await call.settle()
    await _steps()
    assert not call.of_type(ev.TurnJudged) and not call.of_type(ev.SpeechStopped)


async def test_a_question_the_asr_heard_asked_is_complete_whatever_the_model_says():
    """Smart Turn gave Piper's "Sorry, can I ask something else instead" 0.02; Whisper writes it
    with a "?". A last word no sentence ends on still vetoes ("Can I get a?")."""
    call, speculation = await _judged_by_sound_before_the_words("sorry can i ask something else instead",
                                                                 "Sorry, can I ask", 0.02)
    speculation.transcript("Sorry, can I ask something else instead?")
    judgement = await judged(call)
    assert judgement.complete and judgement.words_ask and judgement.probability == 0.02
    assert len(call.of_type(ev.SpeechStopped)) == 1 and call.of_type(ev.TurnJudged)[0].words_ask
    call, speculation = await _judged_by_sound_before_the_words("can i get a", "Can I get", 0.02)
    speculation.transcript("Can I get a?")
    judgement = await judged(call)
    assert judgement.words_ask and judgement.words_hang and not judgement.complete
    # ... but a question may end on a verb or a preposition (Smart Turn gave espeak's 0.13)
    call, speculation = await _judged_by_sound_before_the_words("could you tell me what time it is",
                                                                 "Could you tell me what", 0.13)
    speculation.transcript("Could you tell me what time it is?")
    judgement = await judged(call)
    assert judgement.words_ask and not judgement.words_hang and judgement.complete
    call, speculation = await _judged_by_sound_before_the_words("i would like a tea", "I would like", 0.02)
    speculation.transcript("I would like a tea.")
    judgement = await judged(call)
    assert not judgement.words_ask and not judgement.complete  # a statement: the model decides


async def test_where_the_asr_writes_sentences_one_left_open_needs_a_surer_model():
    """Whisper left Piper's "I would like to order a large", cut mid-sentence, open (Smart Turn
    0.79 after the pause); it closes a finished sentence. ``unclosed_at`` is the pipeline's
    setting; without it the punctuation is not read."""
    sentences = SessionConfig.model_validate({"turn_detection": "semantic_vad", "semantic": {"unclosed_at": 0.9}})
    cases = [(sentences, "I would like to order a large", 0.79, False),
             (sentences, "I would like to order a large tea.", 0.79, True),
             (sentences, "I would like to order a large tea", 0.95, True),
             (SEMANTIC, "I would like to order a large", 0.79, True)]
    for config, final, probability, complete in cases:
        call, speculation = await _judged_by_sound_before_the_words("i would like to order a large", "I would like",
                                                                    probability, config)
        speculation.transcript(final)
        judgement = await judged(call)
        assert judgement.complete is complete, (final, probability)
        assert judgement.words_open is (config is sentences and not final.endswith("."))
        assert call.of_type(ev.TurnJudged)[0].words_open is judgement.words_open
        assert len(call.of_type(ev.SpeechStopped)) == int(complete)

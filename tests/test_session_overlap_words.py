"""Barge-in that listens hears the words too (``barge_in.words``): the judge's rules with words on
stream time, and a session in process (fake clock, scripted runtime) sending the overlap's audio
as an ``OverlapProbe`` and settling by what the scripted ASR says, or by the sound when it says
nothing in time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from duplex.config.session import BargeInConfig, SessionConfig
from duplex.runtime.contract import OverlapProbe, Transcript, TurnRequest
from duplex.session.overlap import Listening, OverlapJudge, OverlapKind
from duplex.session.overlap_words import Said, is_backchannel, spoken_words, what_words_say
from duplex.session.protocol import handle_client_message
from duplex.session.realtime import events as ev
from tests.session_fakes import FRAME_MS, Call, words
from tests.test_session_call import SILENCE_MS, answering, play_until_idle

CONFIG = BargeInConfig()
WORDS = SessionConfig(overlap_probe_request=True)  # a pipeline whose ASR transcribes an overlap
REPLY = ["this", "is", "a", "long", "answer", "to", "your", "question", "told", "at", "some", "length"]
RESUME_FRAMES = CONFIG.resume_ms // FRAME_MS
FINAL_FRAMES = CONFIG.words_final_ms // FRAME_MS  # unvoiced after a sound: the probe's input closes


@pytest.mark.parametrize("text", ["Uh-huh.", "Mm-hmm.", "mhm", "Yeah, okay.", "Oh, I see.", "Got it!", "OK",
                                  "Right, right.", "Yes.", "Sure (laughs)", "Ow.", "Um."])
def test_backchannel_words(text):
    assert is_backchannel(spoken_words(text))


@pytest.mark.parametrize("text", ["Sorry,", "Wait.", "Stop.", "No.", "Um, can I", "Can I ask something else?",
                                  "Yeah, but", "okay stop", "I"])
def test_words_that_are_not_a_backchannel(text):
    assert spoken_words(text) and not is_backchannel(spoken_words(text))


@pytest.mark.parametrize(("text", "floor"), [("I", False), ("Emama.", False), ("Uh-huh.", False), ("", False),
                                            ("Stop.", True), ("Sorry,", True), ("No.", True), ("What?", True),
                                            ("I want", True), ("Yeah, but", True), ("Okay so", True)])
def test_words_take_the_floor_when_there_are_min_words_of_them_or_one_says_so(text, floor):
    """Whisper-base heard Piper's "uh-huh" as "I" and its "mm-hmm" as "Emama.": one word that is no
    command says too little; two words, or "stop", "sorry", "no", "what", take the floor."""
    assert (what_words_say(spoken_words(text), CONFIG.min_words) is Said.FLOOR) is floor
    assert what_words_say(spoken_words("Emama."), CONFIG.min_words) is Said.TOO_FEW
    assert what_words_say(spoken_words("Emama."), 1) is Said.FLOOR  # min_words 1: every other word interrupts


def test_sound_notes_silence_and_spelled_hums_are_no_words():
    assert spoken_words("(coughing)") == spoken_words("[BLANK_AUDIO]") == spoken_words(" ... ") == []
    assert spoken_words("M.A.") == spoken_words("M. H. N.") == [] and spoken_words("I see") == ["i", "see"]
    assert not is_backchannel([])


def test_words_a_noise_could_not_have_said_leave_it_to_the_sound():
    """Whisper-base on a 0.3 s cough said "I'm not a good guy.", on a 0.15 s burst "I'm"."""
    cough = listening()
    push(cough, "v" * 8 + "." * RESUME_FRAMES)  # 240 ms voiced: not five words
    verdict, _ = cough.heard(Transcript("I'm not a good guy.", final=True))
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None
    burst = listening()
    assert burst.heard(Transcript("I'm", final=False)) is None  # 80 ms voiced: under noise_ms, no word is credible
    assert push(burst, "vv" + "." * RESUME_FRAMES) == (None, 2 + RESUME_FRAMES)  # held all the same
    verdict, _ = burst.heard(Transcript("I'm", final=True))
    assert verdict.kind is OverlapKind.NOISE and verdict.words is None


def test_words_the_recogniser_was_not_sure_of_leave_it_to_the_sound():
    """Over a 0.4 s sneeze Whisper-base writes "I'm not sure." with a mean log-probability per
    token far below a caller's words; the same words heard with confidence, or from a recogniser
    that gives none, take the floor."""
    sneeze = "v" * 18 + "." * RESUME_FRAMES  # 440 ms voiced with the onset's: enough for its words
    assert CONFIG.min_logprob is not None
    unsure = CONFIG.min_logprob - 0.5
    guessed = listening()
    assert push(guessed, sneeze) == (None, len(sneeze)) and guessed.waiting_words
    verdict, _ = guessed.heard(Transcript("I'm not sure.", final=True, avg_logprob=unsure))
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None  # the sound's verdict
    for logprob in (CONFIG.min_logprob + 0.5, None):
        meant = listening()
        push(meant, sneeze)
        verdict, _ = meant.heard(Transcript("I'm not sure.", final=True, avg_logprob=logprob))
        assert verdict.interrupts and verdict.words == "I'm not sure."
    anything = listening(BargeInConfig(min_logprob=None))  # the gate off: every word counts
    push(anything, sneeze)
    verdict, _ = anything.heard(Transcript("I'm not sure.", final=True, avg_logprob=unsure))
    assert verdict.interrupts


def listening(config: BargeInConfig = CONFIG, words_coming: bool = True) -> Listening[str]:
    """Listening to an onset recognised with 80 ms voiced, words coming (or not)."""
    heard: Listening[str] = Listening()
    heard.begin(OverlapJudge(config, onset_ms=1000, now_ms=1080, voiced_ms=80), "reply", words_coming)
    return heard


def push(heard: Listening[str], frames: str):
    """Frames written as 'v' (voiced) and '.' (unvoiced); (the verdict, frames taken)."""
    for n, frame in enumerate(frames, 1):
        settled = heard.push(FRAME_MS, frame == "v")
        if settled is not None:
            assert settled[1] == "reply"
            return settled[0], n
    return None, len(frames)


def test_sorry_then_a_pause_waits_for_its_words_and_they_interrupt():
    sorry = "v" * 15 + "." * 30  # "Sorry," (380 ms voiced), then 600 ms of silence
    alone, n = push(listening(words_coming=False), sorry)  # the sound alone resumes at resume_ms
    assert alone.kind is OverlapKind.BACKCHANNEL and n == 15 + RESUME_FRAMES
    heard = listening()
    assert push(heard, sorry) == (None, len(sorry)) and heard.waiting_words  # the reply stays paused
    verdict, reply = heard.heard(Transcript("Sorry,", final=True))
    assert reply == "reply" and verdict.kind is OverlapKind.INTERRUPTION and verdict.words == "Sorry,"
    assert verdict.onset_ms == 1000 and not heard.active


def test_a_word_that_is_no_backchannel_interrupts_as_soon_as_it_is_heard():
    heard = listening()
    assert push(heard, "v" * 8) == (None, 8)  # "stop" is still being said
    verdict, _ = heard.heard(Transcript("Stop", final=False))  # a partial transcript
    assert verdict.interrupts and verdict.words == "Stop" and verdict.span_ms == 80 + 8 * FRAME_MS


def test_a_lone_word_that_takes_no_floor_holds_the_reply_until_rejoin_ms_then_the_sound_decides():
    """Whisper heard Piper's "Wait," as "way" (more words follow a comma pause longer than
    resume_ms) and its "mm-hmm" as "Emama." (nothing follows): neither cuts the reply at once,
    and it resumes only once no word could continue it."""
    rejoin_frames = CONFIG.rejoin_ms // FRAME_MS
    assert rejoin_frames > RESUME_FRAMES
    heard = listening()
    assert heard.heard(Transcript("Way", final=False)) is None  # a partial lone word does not interrupt
    assert push(heard, "v" * 10 + "." * FINAL_FRAMES) == (None, 10 + FINAL_FRAMES)
    assert heard.heard(Transcript("way", final=True)) is None  # final, but it may begin a sentence
    assert push(heard, "." * (rejoin_frames - FINAL_FRAMES - 1)) == (None, rejoin_frames - FINAL_FRAMES - 1)
    verdict, n = push(heard, "." * 5)  # past resume_ms, paused still; at rejoin_ms the sound decides
    assert n == 1 and verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None
    assert verdict.span_ms == 80 + (10 + rejoin_frames) * FRAME_MS
    # words that come once the sound said resume hold it the same way
    held = listening()
    assert push(held, "v" * 10 + "." * RESUME_FRAMES) == (None, 10 + RESUME_FRAMES) and held.waiting_words
    assert held.heard(Transcript("Emama.", final=True)) is None
    assert push(held, "." * rejoin_frames)[1] == rejoin_frames - RESUME_FRAMES
    # more voice within rejoin_ms: the sound goes on, and two words take the floor
    more = listening()
    push(more, "v" * 10 + "." * FINAL_FRAMES)
    assert more.heard(Transcript("way", final=True)) is None
    assert push(more, "." * 5 + "v" * 5) == (None, 10)
    more.rehear()
    assert more.heard(Transcript("Wait, actually", final=False))[0].interrupts


def test_backchannel_words_resume_once_the_sound_has_ended_and_not_before():
    heard = listening()
    assert heard.heard(Transcript("Uh-huh.", final=False)) is None  # a partial backchannel says nothing yet
    assert push(heard, "v" * 10 + "." * RESUME_FRAMES) == (None, 10 + RESUME_FRAMES)
    verdict, _ = heard.heard(Transcript("Uh-huh.", final=True))
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words == "Uh-huh." and not verdict.interrupts
    # final words that came before the sound's end decide at its end
    early = listening()
    assert early.heard(Transcript("Okay.", final=True)) is None
    verdict, n = push(early, "v" * 10 + "." * 40)
    assert n == 10 + RESUME_FRAMES and verdict.kind is OverlapKind.BACKCHANNEL and verdict.words == "Okay."


def test_final_backchannel_words_resume_before_the_silence_that_would_resume_alone():
    assert FINAL_FRAMES < RESUME_FRAMES
    heard = listening()
    assert push(heard, "v" * 10 + "." * (FINAL_FRAMES - 1)) == (None, 9 + FINAL_FRAMES)
    assert not heard.words_final_due()  # the sound may go on: its words are not final yet
    assert push(heard, ".") == (None, 1) and heard.words_final_due()  # the probe's input closes now
    verdict, _ = heard.heard(Transcript("Yeah.", final=True))
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words == "Yeah."
    assert verdict.span_ms == 80 + (10 + FINAL_FRAMES) * FRAME_MS  # not resume_ms after the sound
    # other final words that early interrupt; none leave it to the sound, at resume_ms
    other = listening()
    push(other, "v" * 10 + "." * FINAL_FRAMES)
    assert other.heard(Transcript("Wait", final=True))[0].interrupts
    none = listening()
    push(none, "v" * 10 + "." * FINAL_FRAMES)
    assert none.heard(Transcript("", final=True)) is None
    verdict, n = push(none, "." * RESUME_FRAMES)
    assert n == RESUME_FRAMES - FINAL_FRAMES and verdict.words is None


def test_no_words_leave_the_verdict_to_the_sound():
    heard = listening()
    push(heard, "v" * 8 + "." * RESUME_FRAMES)
    verdict, _ = heard.heard(Transcript("(coughs)", final=True))
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None


def test_words_that_do_not_come_in_time_leave_the_verdict_to_the_sound():
    config = BargeInConfig(words_wait_ms=800)
    verdict, n = push(listening(config), "v" * 10 + "." * 100)
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None
    assert n == 10 + config.words_wait_ms // FRAME_MS  # counted from the sound's end
    # a wait shorter than resume_ms waits for nothing
    verdict, n = push(listening(BargeInConfig(words_wait_ms=0)), "v" * 10 + "." * 100)
    assert n == 10 + RESUME_FRAMES and verdict.words is None


def test_a_transcription_that_fails_leaves_the_verdict_to_the_sound_now_or_later():
    waiting = listening()
    push(waiting, "v" * 10 + "." * RESUME_FRAMES)
    verdict, _ = waiting.words_lost()
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.words is None
    early = listening()
    assert early.words_lost() is None and early.heard(Transcript("Stop", final=False)) is None  # no words expected now
    verdict, n = push(early, "v" * 10 + "." * 40)
    assert n == 10 + RESUME_FRAMES and verdict.kind is OverlapKind.BACKCHANNEL


def test_waiting_for_words_is_not_an_overlap_that_lingers():
    config = BargeInConfig(max_overlap_ms=1000, interrupt_ms=600, words_wait_ms=2000)
    heard = listening(config)
    assert push(heard, "v" * 10 + "." * 60) == (None, 70)  # 1.48 s since the onset, the sound over
    verdict, _ = heard.heard(Transcript("Mm-hmm.", final=True))
    assert verdict.kind is OverlapKind.BACKCHANNEL


def test_speech_again_while_waiting_is_judged_by_the_sound_until_its_words_come():
    heard = listening()
    push(heard, "v" * 10 + "." * RESUME_FRAMES)
    assert heard.waiting_words
    assert push(heard, "v" * 5) == (None, 5) and not heard.waiting_words
    heard.rehear()  # the whole overlap is transcribed again
    assert heard.heard(Transcript("Yeah.", final=True)) is None  # the first words: the second sound is going on
    verdict, _ = heard.heard(Transcript("Yeah. No, stop.", final=False))
    assert verdict.interrupts


# -- a session in process -----------------------------------------------------------------------
def probes(call: Call) -> list:
    return [t for t in call.runtime.turns if isinstance(t.request, OverlapProbe)]


def replies(call: Call) -> list:
    return [t for t in call.runtime.turns if isinstance(t.request, TurnRequest)]


async def test_sorry_and_a_pause_interrupt_by_their_words_and_the_reply_never_resumes():
    call = Call(WORDS)
    await answering(call, *REPLY, complete=False)
    reply = call.runtime.last
    await call.say(words("sorry"))
    await call.quiet(CONFIG.resume_ms + 4 * FRAME_MS)  # longer than resume_ms: the sound alone would resume
    [probe] = probes(call)
    assert probe.request == OverlapProbe(session_id="sess_fake01") and probe.eos  # the sound's end: its final
    assert not call.of_type(ev.ResponseResumed) and call.session.playout.paused and not reply.aborted
    paused = call.of_type(ev.ResponsePaused)[0]
    probe.transcript("Sorry,", final=True)
    probe.complete()
    await call.settle()
    judged = call.of_type(ev.OverlapJudged)[0]
    assert (judged.kind, judged.decided_by, judged.transcript) == ("interruption", "words", "Sorry,")
    assert reply.aborted and not call.of_type(ev.ResponseResumed)
    started = call.of_type(ev.SpeechStarted)[1]
    assert started.audio_start_ms == paused.audio_start_ms  # the caller's turn from the onset, all its audio
    await call.say(words("can I ask something else"))
    await call.quiet(SILENCE_MS + 2 * FRAME_MS)
    turn = replies(call)[-1]
    stopped = call.of_type(ev.SpeechStopped)[-1]
    assert len(replies(call)) == 2 and turn.eos  # one turn: "sorry", the pause and the question
    prefix_ms = SessionConfig().vad.prefix_padding_ms
    assert turn.fed_ms == prefix_ms + stopped.audio_end_ms + SILENCE_MS - started.audio_start_ms
    # the probe heard the same audio, from the onset's prefix on, up to words_final_ms after the sound
    probe_audio = np.concatenate([a.samples for a in probe.fed])
    assert np.array_equal(probe_audio, turn.fed[0].samples[:len(probe_audio)]) and probe.voiced == \
        turn.voiced[:len(probe.voiced)] and probe.voiced[-FINAL_FRAMES - 1:] == [True] + [False] * FINAL_FRAMES
    assert call.session.stats()["barge_ins"] == 1


async def test_a_short_command_interrupts_by_its_words_and_okay_resumes_with_its_words():
    call = Call(WORDS)
    await answering(call, *REPLY, complete=False)
    reply = call.runtime.last
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    first = probes(call)[0]
    first.transcript("Okay.", final=True)
    first.complete()
    await call.settle()
    resumed = call.of_type(ev.ResponseResumed)
    assert [(r.kind, r.transcript) for r in resumed] == [("backchannel", "Okay.")] and not reply.aborted
    await call.quiet(CONFIG.rejoin_ms + 2 * FRAME_MS)
    await call.say(words("stop it"))  # a short command, under interrupt_ms: the sound alone would resume
    second = probes(call)[1]
    second.transcript("Stop it.", final=False)
    await call.settle()
    assert reply.aborted and second.aborted and len(call.of_type(ev.ResponseResumed)) == 1
    assert [j.decided_by for j in call.of_type(ev.OverlapJudged)] == ["words", "words"]


async def test_an_asr_that_says_nothing_in_time_leaves_it_to_the_sound_and_its_probe_is_aborted():
    async def resumed(config: SessionConfig) -> tuple[ev.ResponseResumed, Call]:
        call = Call(config)
        await answering(call, *REPLY)
        await call.say(words("okay"))
        await call.quiet(CONFIG.words_wait_ms + 2 * FRAME_MS)
        [event] = call.of_type(ev.ResponseResumed)
        return event, call

    by_sound, _ = await resumed(SessionConfig())
    waited, call = await resumed(WORDS)
    assert waited.transcript is None and probes(call)[0].aborted
    assert waited.overlap_ms - by_sound.overlap_ms == CONFIG.words_wait_ms - CONFIG.resume_ms  # from the sound's end
    await play_until_idle(call)
    assert [d.response.status for d in call.of_type(ev.ResponseDone)] == ["completed"]


async def test_a_failed_transcription_resumes_by_the_sound_at_once():
    call = Call(WORDS)
    await answering(call, *REPLY)
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    probes(call)[0].fail("asr down")
    await call.settle()
    [resumed] = call.of_type(ev.ResponseResumed)
    assert resumed.kind == "backchannel" and resumed.transcript is None


async def test_no_probe_where_the_pipeline_has_no_words_or_the_client_turns_them_off():
    call = Call()  # overlap_probe_request false: toy-voice's syllable measure, omni-tiny
    await answering(call, *REPLY)
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    assert not probes(call) and call.of_type(ev.ResponseResumed)[0].transcript is None
    call = Call(WORDS)
    update = {"type": "session.update", "session": {"barge_in": {"words": False, "words_wait_ms": 500}}}
    handle_client_message(call.session, json.dumps(update), "toy")
    assert call.of_type(ev.SessionUpdated)[-1].session["barge_in"]["words"] is False
    await answering(call, *REPLY)
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    assert not probes(call) and call.of_type(ev.ResponseResumed)[0].transcript is None
    handle_client_message(call.session, json.dumps({"type": "session.update", "session": {
        "barge_in": {"words_wait_ms": 9000}}}), "toy")
    assert "words_wait_ms" in call.of_type(ev.ErrorEvent)[-1].error.message


async def test_hanging_up_while_the_words_are_awaited_aborts_the_probe():
    call = Call(WORDS)
    await answering(call, *REPLY, complete=False)
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    probe = probes(call)[0]
    await call.session.close()
    assert probe.aborted and probe.read_to_end


async def test_speech_again_before_the_words_come_waits_for_them_and_they_still_cut():
    call = Call(WORDS)
    await answering(call, *REPLY, complete=False)
    reply = call.runtime.last
    await call.say(words("sorry"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    await call.say(words("can"))  # the caller goes on before the words of "sorry" are back
    [probe] = probes(call)
    assert probe.eos and not probe.aborted and not reply.aborted and not call.of_type(ev.ResponseResumed)
    probe.transcript("Sorry,", final=True)
    probe.complete()
    await call.settle()
    assert reply.aborted and call.of_type(ev.OverlapJudged)[0].transcript == "Sorry,"
    await call.say(words("I ask something else"))
    await call.quiet(SILENCE_MS + 2 * FRAME_MS)
    assert len(replies(call)) == 2 and replies(call)[-1].eos and len(call.of_type(ev.SpeechStopped)) == 2
    assert not call.of_type(ev.ResponseResumed) and len(probes(call)) == 1


async def test_speech_again_after_backchannel_words_is_heard_anew():
    patient = BargeInConfig(interrupt_ms=1500, max_overlap_ms=3000)  # the sound alone interrupts later
    call = Call(SessionConfig(overlap_probe_request=True, barge_in=patient))
    await answering(call, *REPLY, complete=False)
    reply = call.runtime.last
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)  # the sound's end: its final words are asked for
    await call.say(words("wait"))  # ... and the caller goes on before they come
    first = probes(call)[0]
    first.transcript("Okay.", final=True)  # a backchannel: the second sound says more
    first.complete()
    await call.settle()
    assert not call.of_type(ev.OverlapJudged) and len(probes(call)) == 1
    await call.say(words("wait"))
    second = probes(call)[1]  # the whole overlap, heard anew from its onset's prefix
    assert np.array_equal(second.fed[0].samples[:len(first.fed[0].samples)], first.fed[0].samples)
    second.transcript("Okay. Wait, wait.", final=False)
    await call.settle()
    assert reply.aborted and call.of_type(ev.OverlapJudged)[0].transcript == "Okay. Wait, wait."

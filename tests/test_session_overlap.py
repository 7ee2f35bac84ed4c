"""Barge-in that listens before it cuts (``barge_in.mode: listen``, the default): the judge's
rules on stream time, and a session in process (fake clock, scripted runtime) pausing its reply
at a caller's onset, then resuming it exactly where it stopped or stopping it for good."""

from __future__ import annotations

import json

import pytest

from duplex.config.session import BargeInConfig, SessionConfig
from duplex.models.toy_voice.synth import speak
from duplex.runtime.contract import SESSION_RATE, Heard
from duplex.session.heard import VoicedText
from duplex.session.overlap import OverlapJudge, OverlapKind
from duplex.session.protocol import handle_client_message
from duplex.session.realtime import events as ev
from tests.session_fakes import FRAME_MS, Call, silence, words
from tests.test_session_call import ONSET, SILENCE_MS, answering, play_until_idle

CONFIG = BargeInConfig()
REPLY = ["this", "is", "a", "long", "answer", "to", "your", "question", "told", "at", "some", "length"]


def judge(frames: str, config: BargeInConfig = CONFIG):
    """Run the judge over frames written as 'v' (voiced) and '.' (unvoiced) after an onset
    recognised with 80 ms voiced; returns (verdict, frames it took)."""
    j = OverlapJudge(config, onset_ms=1000, now_ms=1080, voiced_ms=80)
    for n, frame in enumerate(frames, 1):
        verdict = j.push(FRAME_MS, frame == "v")
        if verdict is not None:
            return verdict, n
    return None, len(frames)


def test_a_short_voiced_sound_then_silence_is_a_backchannel_decided_after_resume_ms():
    verdict, n = judge("v" * 16 + "." * 20)  # 80 + 320 ms voiced: "uh-huh"
    assert verdict.kind is OverlapKind.BACKCHANNEL and not verdict.interrupts
    assert n == 16 + CONFIG.resume_ms // FRAME_MS
    assert (verdict.voiced_ms, verdict.span_ms) == (400, 80 + n * FRAME_MS)


def test_a_click_or_cough_is_noise():
    verdict, _ = judge("vv" + "." * 20)
    assert verdict.kind is OverlapKind.NOISE and verdict.voiced_ms == 120 < CONFIG.noise_ms


def test_speech_that_goes_on_interrupts_the_moment_it_reaches_interrupt_ms():
    frames_needed = (CONFIG.interrupt_ms - 80) // FRAME_MS
    verdict, n = judge("v" * 100)
    assert verdict.interrupts and n == frames_needed and verdict.voiced_ms == CONFIG.interrupt_ms
    # short gaps between words do not end the overlap: they are under resume_ms
    gap = "." * (CONFIG.resume_ms // FRAME_MS - 1)
    verdict, _ = judge(("v" * 5 + gap) * 10)
    assert verdict.interrupts


def test_an_overlap_that_lingers_interrupts_at_max_overlap_ms():
    config = BargeInConfig(interrupt_ms=2000, max_overlap_ms=2000, resume_ms=200)
    verdict, n = judge("v....." * 100, config)  # voiced now and then, never 200 ms unvoiced
    assert verdict.interrupts and verdict.span_ms == config.max_overlap_ms and verdict.voiced_ms < 2000


def test_a_sound_soon_after_a_backchannel_continues_it_and_one_later_does_not():
    first, _ = judge("v" * 12 + "." * (CONFIG.resume_ms // FRAME_MS))  # "Wait," (320 ms voiced), then quiet
    assert first.kind is OverlapKind.BACKCHANNEL and first.sound_end_ms == 1080 + 12 * FRAME_MS
    soon = OverlapJudge(CONFIG, onset_ms=first.sound_end_ms + CONFIG.rejoin_ms, now_ms=0, voiced_ms=80)
    soon.continues(first)
    later = OverlapJudge(CONFIG, onset_ms=first.sound_end_ms + CONFIG.rejoin_ms + FRAME_MS, now_ms=0, voiced_ms=80)
    later.continues(first)
    assert (soon.voiced_ms, later.voiced_ms) == (80 + first.voiced_ms + CONFIG.rejoin_ms, 80)


def test_a_click_too_short_to_start_a_turn_is_continued_by_no_sound():
    """A 40 ms click pauses a reply (``pause_speech_ms`` under ``vad.min_speech_ms``) and is judged
    noise; a second click soon after is a new sound, not the rest of an utterance."""
    word_ms = SessionConfig().vad.min_speech_ms
    click = OverlapJudge(CONFIG, onset_ms=1000, now_ms=1060, voiced_ms=60, word_ms=word_ms)
    first = next(v for v in (click.push(FRAME_MS, False) for _ in range(40)) if v is not None)
    assert first.kind is OverlapKind.NOISE and first.voiced_ms < word_ms
    second = OverlapJudge(CONFIG, onset_ms=first.sound_end_ms + FRAME_MS, now_ms=0, voiced_ms=60, word_ms=word_ms)
    second.continues(first)
    assert second.voiced_ms == 60
    word = OverlapJudge(CONFIG, onset_ms=1000, now_ms=1080, voiced_ms=word_ms, word_ms=word_ms)
    short = next(v for v in (word.push(FRAME_MS, False) for _ in range(40)) if v is not None)
    after = OverlapJudge(CONFIG, onset_ms=short.sound_end_ms + FRAME_MS, now_ms=0, voiced_ms=60, word_ms=word_ms)
    after.continues(short)  # a sound as long as a turn's start is a word: it is continued
    assert after.voiced_ms == 60 + word_ms + FRAME_MS


async def test_wait_then_stop_is_one_interruption():
    call = Call()
    await answering(call, *REPLY, complete=False)
    first = call.runtime.last
    await call.say(words("wait"))  # 230 ms
    await call.quiet(CONFIG.resume_ms + FRAME_MS)  # judged a backchannel: the reply plays on ...
    assert len(call.of_type(ev.ResponseResumed)) == 1 and not first.aborted
    await call.say(words("stop now"))  # ... and the next words, soon after, add up to an interruption
    assert first.aborted and call.of_type(ev.ItemTruncated)


async def test_a_backchannel_pauses_the_reply_and_it_resumes_exactly_where_it_stopped():
    call = Call()
    seconds = await answering(call, *REPLY)
    reply = call.runtime.last
    played_before = len(call.loud_frames())
    await call.say(words("okay"))
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    paused, resumed = call.of_type(ev.ResponsePaused), call.of_type(ev.ResponseResumed)
    assert len(paused) == 1 and len(resumed) == 1 and resumed[0].kind == "backchannel"
    # silent from the frame after the onset was recognised until the resume; never a repeat
    stop, go = call.frame_of(paused[0]), call.frame_of(resumed[0])
    loud = call.loud_frames()
    assert not [i for i in loud if stop <= i < go] and stop - 1 in loud and go in loud
    assert paused[0].audio_end_ms == resumed[0].audio_end_ms == (stop - loud[0]) * FRAME_MS
    await play_until_idle(call)
    assert len(call.loud_frames()) == pytest.approx(1000 * seconds / FRAME_MS, abs=1)  # all of it, once
    assert played_before < len(call.loud_frames())
    assert not reply.aborted and [d.response.status for d in call.of_type(ev.ResponseDone)] == ["completed"]
    assert len(call.of_type(ev.SpeechStarted)) == 1 and len(call.runtime.turns) == 1  # no turn for "uh-huh"
    assert call.session.stats()["resumed"] == 1 and call.session.stats()["barge_ins"] == 0


async def test_a_live_reply_pauses_after_pause_speech_ms_voiced_sooner_than_a_turn_starts():
    """The pause is undone if the sound is no interruption, so it needs less voiced audio
    (``pause_speech_ms``) than a turn's start (``vad.min_speech_ms``); in onset mode, where the
    onset cuts for good, the turn's threshold holds."""
    vad, quick = SessionConfig().vad, BargeInConfig(pause_speech_ms=60)
    assert quick.pause_speech_ms < vad.min_speech_ms

    async def frames_to(mode: str) -> int:
        call = Call(SessionConfig(barge_in=quick.model_copy(update={"mode": mode})))
        await answering(call, *REPLY, complete=False)
        said_at = len(call.played)
        await call.say(words("okay"))
        kind = ev.ResponsePaused if mode == "listen" else ev.SpeechStarted
        return call.frame_of(call.of_type(kind)[-1]) - said_at

    listen, onset = await frames_to("listen"), await frames_to("onset")
    assert onset - listen == (vad.min_speech_ms - quick.pause_speech_ms) // FRAME_MS


async def test_an_interruption_stops_the_reply_at_the_onset_and_the_turn_has_all_its_audio():
    call = Call()
    await answering(call, *REPLY, complete=False)
    first = call.runtime.last
    await call.say(words("wait I would like to order tea instead please"))
    await call.quiet(SILENCE_MS + 2 * FRAME_MS)
    paused = call.of_type(ev.ResponsePaused)[0]
    stop = call.frame_of(paused)
    assert all(i < stop for i in call.loud_frames())  # nothing more of it was heard after the onset
    assert first.aborted and not call.of_type(ev.ResponseResumed)
    done = call.of_type(ev.ResponseDone)[0].response
    assert (done.status, done.status_details.reason) == ("cancelled", "turn_detected")
    truncated = call.of_type(ev.ItemTruncated)[0]
    assert truncated.audio_end_ms == paused.audio_end_ms  # heard: up to the pause, exactly
    second = call.runtime.last
    assert second.request.heard == Heard(request_id=first.request_id, audio_end_ms=truncated.audio_end_ms,
                                         text=truncated.transcript)
    started = call.of_type(ev.SpeechStarted)[1]
    assert started.audio_start_ms == paused.audio_start_ms  # the turn starts at the onset, not the verdict
    # the new turn's request got the caller's audio from the onset's prefix on, nothing lost
    stopped = call.of_type(ev.SpeechStopped)[-1]
    prefix_ms = SessionConfig().vad.prefix_padding_ms
    assert second.eos and second.fed_ms == prefix_ms + stopped.audio_end_ms + SILENCE_MS - started.audio_start_ms
    # the caller heard the agent stop when the onset was recognised, not when the verdict came
    assert 0 < call.session.last_barge_in_ms <= SessionConfig().vad.start_window_ms + FRAME_MS
    assert call.session.stats()["barge_ins"] == 1


async def test_a_cough_resumes_the_reply_as_noise():
    call = Call()
    await answering(call, *REPLY)
    await call.say(words("okay")[: 16 * 150])  # 150 ms of voiced sound: under noise_ms
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    assert [r.kind for r in call.of_type(ev.ResponseResumed)] == ["noise"]
    await play_until_idle(call)
    assert [d.response.status for d in call.of_type(ev.ResponseDone)] == ["completed"]


async def test_the_client_switches_to_any_onset_interrupts_with_session_update():
    call = Call()
    update = {"type": "session.update", "session": {"barge_in": {"mode": "onset"}}}
    handle_client_message(call.session, json.dumps(update), "toy")
    described = call.of_type(ev.SessionUpdated)[-1].session["barge_in"]
    assert described["mode"] == "onset"
    await answering(call, *REPLY, complete=False)
    first = call.runtime.last
    await call.say(words("okay"))
    await call.say(silence(FRAME_MS))
    assert first.aborted and not call.of_type(ev.ResponsePaused)


async def test_the_client_cancelling_while_we_listen_leaves_nothing_paused():
    call = Call()
    await answering(call, *REPLY, complete=False)
    first = call.runtime.last
    await call.say(words("okay")[: 16 * 100])
    assert call.of_type(ev.ResponsePaused) and call.session.cancel_response()
    await call.quiet(CONFIG.resume_ms + 2 * FRAME_MS)
    assert first.aborted and not call.of_type(ev.ResponseResumed) and not call.session.playout.paused
    assert call.session.state.value == "idle"


@pytest.mark.parametrize("heard_words", [1, 3, 6])
async def test_an_interrupted_replys_history_keeps_the_words_whose_audio_was_played(heard_words):
    """Each chunk says which word it voices (as TTS stages do); the cut falls inside word
    ``heard_words + 1``, before its middle: the words before it were heard, it was not."""
    call = Call(ONSET)
    await answering(call, play_ms=0, complete=False)
    reply = call.runtime.last
    chunk_ms = [1000 * len(speak(w, i)) / SESSION_RATE for i, w in enumerate(REPLY)]
    reply.say(*REPLY)
    cut_ms = sum(chunk_ms[:heard_words]) + chunk_ms[heard_words] / 4
    await call.quiet(round(cut_ms) - 2 * FRAME_MS)  # the onset is recognised 80 ms after it began
    await call.say(words("wait I would like to order tea instead please"))
    truncated = call.of_type(ev.ItemTruncated)[0]
    assert abs(truncated.audio_end_ms - cut_ms) <= 3 * FRAME_MS
    assert truncated.transcript == " ".join(REPLY[:heard_words])
    assert call.runtime.last.request.heard.text == truncated.transcript


def test_heard_text_is_none_when_no_chunk_says_what_it_voices():
    voiced = VoicedText()
    voiced.add(400, "")
    assert voiced.heard(200) is None
    voiced = VoicedText()
    voiced.add(500, "hello there")
    voiced.add(500, "how are you")
    assert [voiced.heard(ms) for ms in (0, 300, 500, 800, 1000)] == [
        "", "hello", "hello there", "hello there how", "hello there how are you"]


def test_a_short_end_of_turn_silence_shortens_the_wait_to_resume():
    j = OverlapJudge(CONFIG, onset_ms=0, now_ms=80, voiced_ms=80, turn_silence_ms=180)
    verdicts = [j.push(FRAME_MS, False) for _ in range(9)]
    assert verdicts[:8] == [None] * 8 and verdicts[8].kind is OverlapKind.NOISE  # at 180 ms, not resume_ms

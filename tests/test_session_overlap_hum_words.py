"""Words too few for the voice they came with (``barge_in.max_voiced_ms_per_word``): a hum's
made-up words are no words, the same words spoken at a caller's pace are, and a floor word drawn
out still takes the floor; over a sound more likely a backchannel or a noise
(``max_voiced_ms_per_word_other``) words must come faster. The judge's rules on stream time
(``Listening``)."""

from __future__ import annotations

from duplex.config.session import BargeInConfig
from duplex.runtime.contract import Transcript
from duplex.session.overlap import Listening, OverlapJudge
from tests.session_fakes import FRAME_MS
from tests.test_session_overlap_words import CONFIG, RESUME_FRAMES, push


def test_a_few_words_over_a_long_hum_are_no_words_and_the_same_words_spoken_or_a_floor_word_are():
    """Whisper-base writes "Em em them." over a drawn-out "mm-hmm, mm-hmm" that the sound reading
    held for its words: three words for nearly a second of voice, slower than anyone speaks; said
    in 600 ms they are a caller's, and "wait, wait" drawn out as long still takes the floor."""
    assert CONFIG.max_voiced_ms_per_word is not None
    hum_frames = 3 * CONFIG.max_voiced_ms_per_word // FRAME_MS + 1 - 4  # with the onset's 80 ms: past the ceiling
    short_frames = 600 // FRAME_MS - 4

    def held(config: BargeInConfig = CONFIG) -> Listening[str]:
        heard: Listening[str] = Listening(sound=lambda: True)  # the sound read as a hum: held for its words
        heard.begin(OverlapJudge(config, onset_ms=1000, now_ms=1080, voiced_ms=80), "reply", True)
        return heard

    def verdict_on(text: str, frames: int, config: BargeInConfig = CONFIG):
        heard = held(config)
        assert push(heard, "v" * frames + "." * RESUME_FRAMES) == (None, frames + RESUME_FRAMES)
        assert heard.judge is not None
        voiced_ms = heard.judge.voiced_ms
        return heard.heard(Transcript(text, final=True))[0], voiced_ms

    verdict, voiced_ms = verdict_on("Em em them.", hum_frames)
    assert voiced_ms > 3 * CONFIG.max_voiced_ms_per_word
    assert not verdict.interrupts and verdict.words is None  # the sound's verdict
    verdict, voiced_ms = verdict_on("Em em them.", short_frames)
    assert voiced_ms <= 3 * CONFIG.max_voiced_ms_per_word
    assert verdict.interrupts and verdict.words == "Em em them."
    assert verdict_on("Wait, wait.", hum_frames)[0].interrupts
    assert verdict_on("Em em them.", hum_frames, BargeInConfig(max_voiced_ms_per_word=None))[0].interrupts


def test_over_a_sound_like_a_backchannel_words_must_come_faster_and_the_sound_is_read_only_where_it_counts():
    """Whisper-base writes "And make him." over a "mhm": three words at a slow caller's pace. Over
    a sound the learned reading hears as more likely a backchannel or a noise they are no words;
    over one it hears as a caller's, or said briskly, or with a floor word, they take the floor;
    a lone word never asks the sound."""
    assert CONFIG.max_voiced_ms_per_word is not None and CONFIG.max_voiced_ms_per_word_other is not None
    ceiling = CONFIG.max_voiced_ms_per_word_other
    between_frames = 3 * (ceiling + CONFIG.max_voiced_ms_per_word) // 2 // FRAME_MS - 4  # between the two ceilings
    brisk_frames = 3 * ceiling // FRAME_MS - 4 - 1
    asked: list[bool] = []

    def verdict_on(text: str, frames: int, other: bool, config: BargeInConfig = CONFIG):
        def sounds_other() -> bool:
            asked.append(other)
            return other

        heard: Listening[str] = Listening(sound=lambda: True, sounds_other=sounds_other)
        heard.begin(OverlapJudge(config, onset_ms=1000, now_ms=1080, voiced_ms=80), "reply", True)
        assert push(heard, "v" * frames + "." * RESUME_FRAMES) == (None, frames + RESUME_FRAMES)
        assert heard.judge is not None
        voiced_ms = heard.judge.voiced_ms
        settled = heard.heard(Transcript(text, final=True))
        return (None if settled is None else settled[0]), voiced_ms

    verdict, voiced_ms = verdict_on("And make him.", between_frames, other=True)
    assert 3 * ceiling < voiced_ms <= 3 * CONFIG.max_voiced_ms_per_word
    assert not verdict.interrupts and verdict.words is None  # the sound's verdict
    assert verdict_on("And make him.", between_frames, other=False)[0].interrupts
    verdict, voiced_ms = verdict_on("And make him.", brisk_frames, other=True)
    assert voiced_ms <= 3 * ceiling and verdict.interrupts
    assert verdict_on("Hold on, make him.", between_frames, other=True)[0].interrupts
    assert verdict_on("And make him.", between_frames, True, BargeInConfig(max_voiced_ms_per_word_other=None))[0] \
        .interrupts
    # a lone word is read the same whatever the sound (too few: the sound decides later): not asked
    asked.clear()
    assert verdict_on("Him.", between_frames, other=True)[0] is None
    assert asked == []
    # one transcript, weighed more than once, reads the sound once
    verdict_on("And make him.", between_frames, other=True)
    assert asked == [True]


async def test_a_session_reads_the_overlaps_sound_for_the_pace_of_its_words_only_when_learned(monkeypatch):
    """The session asks the learned reading (``read_other``) with the overlap's sound; three
    words between the two ceilings then resume the reply over a sound it hears as a backchannel
    and interrupt over one it hears as a caller's; with ``sound: voiced`` it is never asked."""
    from duplex.config.session import SessionConfig
    from duplex.session import listen
    from duplex.session.overlap_sound import SoundTrace
    from duplex.session.realtime import events as ev
    from tests.session_fakes import Call, words
    from tests.test_session_call import answering
    from tests.test_session_overlap_words import REPLY, probes

    asked: list[int] = []
    hears_other = True

    def other(trace: SoundTrace) -> bool:
        asked.append(len(trace.voiced))
        return hears_other

    monkeypatch.setattr(listen, "read_sound", lambda trace: True)  # held for its words at interrupt_ms
    monkeypatch.setattr(listen, "read_other", other)
    for sound, hears_other in (("learned", True), ("learned", False), ("voiced", True)):
        asked.clear()
        call = Call(SessionConfig(overlap_probe_request=True, barge_in=BargeInConfig(sound=sound)))
        await answering(call, *REPLY, complete=False)
        first = call.runtime.last
        await call.say(words("mm hmm mm hmm"))
        await call.quiet(CONFIG.words_final_ms + 2 * FRAME_MS)
        if sound == "voiced":  # cut by its voiced time before any word: nothing asked
            assert first.aborted and not asked
            continue
        probe = probes(call)[0]
        probe.transcript("And make him.", final=True)
        probe.complete()
        await call.quiet(CONFIG.resume_ms)  # no words: the sound's verdict, once it says resume
        await call.settle()
        (judged,) = call.of_type(ev.OverlapJudged)
        assert asked and asked[0] > 0
        assert 3 * CONFIG.max_voiced_ms_per_word_other < judged.voiced_ms <= 3 * CONFIG.max_voiced_ms_per_word
        assert first.aborted is not hears_other and (judged.kind == "interruption") is not hears_other

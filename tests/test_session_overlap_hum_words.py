"""Words too few for the voice they came with (``barge_in.max_voiced_ms_per_word``): a hum's
made-up words are no words, the same words spoken at a caller's pace are, and a floor word drawn
out still takes the floor. The judge's rules on stream time (``Listening``)."""

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

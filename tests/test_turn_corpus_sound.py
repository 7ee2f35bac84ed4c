"""The learned reading of an overlap's sound (``barge_in.sound: learned``) on clips of the synthetic
corpus, in process on stream time (the session's VAD, turn detector and listening barge-in;
Whisper-base on the probe's audio as the local pipeline runs it): speakers of the held-out part.
A doubled backchannel, a breath and a burst of music, which 600 ms of voice cuts today before any
word of them is heard, are held for their words and the reply resumes; words Whisper makes up
over a "mhm" at a slow caller's pace count as none over a sound it hears as a backchannel; real
interruptions are still honoured, within ``max_overlap_ms`` of their onset."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex.session.turn_model import shipped_models
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.ears import Ears
from duplex_tools.turn_corpus.evaluate import Settings
from duplex_tools.turn_corpus.render import render
from duplex_tools.turn_corpus.simulate import OverlapRun, frames_of, run_overlap

MODELS = shipped_models()
pytestmark = pytest.mark.skipif(MODELS is None or MODELS.sound is None,
                                reason="duplex/session/turn_model.json has no sound reading")

HELD_OUT = {s.synth: s for s in reversed(spec.speakers_of("held-out"))}  # the first of each synthesiser
SETTINGS = Settings()


def _runs(tmp_path: Path, synth: str, category: str, variant: str) -> tuple[OverlapRun, OverlapRun]:
    """The clip (clean) judged as today (the voiced time) and with the learned sound reading."""
    assert MODELS is not None
    frames = frames_of(render(tmp_path, spec.Clip(category, variant, "clean", HELD_OUT[synth])), SETTINGS.vad)
    ears = Ears(tmp_path)
    barge_in, vad = SETTINGS.barge_in, SETTINGS.vad
    today = run_overlap(frames, ears, barge_in, vad, SETTINGS.asr_ms)
    learned = run_overlap(frames, ears, barge_in, vad, SETTINGS.asr_ms, sound=MODELS.sound_holds,
                          other=MODELS.sounds_other)
    return today, learned


@pytest.mark.parametrize(("synth", "category", "variant"), [("espeak", "backchannel", "uh-huh x2"),
                                                            ("espeak", "noise", "breath"),
                                                            ("piper", "noise", "music/tv")])
def test_a_sound_the_voiced_time_cuts_is_held_for_its_words_and_the_reply_resumes(tmp_path: Path, synth: str,
                                                                                  category: str, variant: str):
    today, learned = _runs(tmp_path, synth, category, variant)
    assert today.takeover and today.checked  # cut today, when its voiced time reached interrupt_ms ...
    assert today.decided_ms is not None and today.onset_ms is not None
    assert today.decided_ms - today.onset_ms < SETTINGS.barge_in.max_overlap_ms
    assert learned.held and not learned.takeover  # ... held for its words, and the reply resumed


@pytest.mark.parametrize(("synth", "variant"), [("espeak", "no, I said"), ("piper", "hang on"),
                                                ("piper", "a name")])
def test_a_real_interruption_is_still_honoured_soon(tmp_path: Path, synth: str, variant: str):
    _, learned = _runs(tmp_path, synth, "interruption", variant)
    assert learned.takeover and learned.decided_ms is not None and learned.onset_ms is not None
    assert learned.decided_ms - learned.onset_ms <= SETTINGS.barge_in.max_overlap_ms


@pytest.mark.parametrize(("speaker", "condition"), [("espeak:en-us+f2:170:65", "room"),
                                                     ("espeak:en-gb-x-gbcwmd+m7:140:45", "clean")])
def test_words_made_up_over_a_hum_at_a_slow_callers_pace_do_not_cut_the_reply(tmp_path: Path, speaker: str,
                                                                               condition: str):
    """Whisper-base makes three words up over 700-740 ms of these "mhm"s ("Come with him.", "In my
    chin."): under ``max_voiced_ms_per_word`` each, so they cut the reply; over
    ``max_voiced_ms_per_word_other`` each, over a sound the learned reading hears as more likely a
    backchannel, so with that reading they count as none and the reply resumes."""
    assert MODELS is not None
    voice = next(s for s in spec.speakers_of("held-out") if s.name == speaker)
    frames = frames_of(render(tmp_path, spec.Clip("backchannel", "mhm", condition, voice)), SETTINGS.vad)
    ears = Ears(tmp_path)
    barge_in, vad = SETTINGS.barge_in, SETTINGS.vad
    pace_alone = run_overlap(frames, ears, barge_in, vad, SETTINGS.asr_ms, sound=MODELS.sound_holds)
    with_sound = run_overlap(frames, ears, barge_in, vad, SETTINGS.asr_ms, sound=MODELS.sound_holds,
                             other=MODELS.sounds_other)
    assert pace_alone.words == with_sound.words and len(pace_alone.words) == 1  # the same words, heard once
    assert pace_alone.takeover and not with_sound.takeover

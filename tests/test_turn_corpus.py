"""The synthetic turn-taking corpus (tools/duplex_tools/turn_corpus): made the same on every run,
as big as the bench needs (speakers, variants, conditions, disjoint parts), and its learned
decisions trained the same from the same clips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from duplex.config.session import VadConfig
from duplex.session.overlap_sound import SOUND_FEATURES
from duplex.session.turn_model import OVERLAP_FEATURES, PAUSE_FEATURES, MLPModel, TurnModels
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.evaluate import Examples, JudgedPause
from duplex_tools.turn_corpus.folds import EVERY, RULES, WITHOUT, print_folds, sentence_folds
from duplex_tools.turn_corpus.render import render
from duplex_tools.turn_corpus.simulate import BACKGROUND_CLEAR, FRAME, frames_of
from duplex_tools.turn_corpus.train import HOLD_BUDGET, fit_mlp, train, write

ESPEAK = next(s for s in spec.speakers_of("espeak") if s.shift_cents)  # sox shifts its pitch too


def test_the_corpus_holds_what_the_bench_needs_in_disjoint_parts():
    assert len(spec.SPEAKERS) >= 24 and len({s.name for s in spec.SPEAKERS}) == len(spec.SPEAKERS)
    assert len({form.removesuffix(" x2") for form in spec.BACKCHANNELS}) >= 12
    assert len(spec.NOISES) >= 8 and len(spec.INTERRUPTIONS) >= 12 and len(spec.PAUSES) >= 8
    dev, held_out = set(spec.speakers_of("dev")), set(spec.speakers_of("held-out"))
    assert not dev & held_out and dev | held_out == set(spec.SPEAKERS)
    for part in (dev, held_out):  # each part has both synthesisers
        assert {s.synth for s in part} == {"espeak", "piper"}
    # every cell (variant x condition) has speakers of both parts
    for part in ("dev", "held-out"):
        cells = {(c.category, c.variant, c.condition) for c in spec.clips(part)}
        assert len(cells) == sum(len(spec.variants(c)) for c in spec.CATEGORIES) * len(spec.CONDITIONS)
    with pytest.raises(ValueError, match="unknown corpus split 'nope'"):
        spec.speakers_of("nope")


@pytest.mark.parametrize("condition", spec.CONDITIONS)
def test_a_clip_is_made_the_same_on_every_run(tmp_path: Path, condition: str):
    clip = spec.Clip("pause", "after and", condition, ESPEAK)
    first, again = render(tmp_path / "a", clip), render(tmp_path / "b", clip)
    assert np.array_equal(first.audio, again.audio) and first.audio.dtype == np.int16
    assert (first.start, first.pause_at, first.end) == (again.start, again.pause_at, again.end)
    assert first.pause_at is not None and first.start < first.pause_at < first.end
    # the pause put in is quiet for the pause's length (clean: near digital silence, -60 dBFS; the
    # sox pitch shift smears a little of the words into it)
    pause = first.audio[first.pause_at + 320:first.pause_at + int(spec.PAUSE_S * 16000) - 320]
    if condition == "clean":
        assert np.sqrt(np.mean(pause.astype(np.float64) ** 2)) < 32768 * 1e-3
    noise = spec.Clip("noise", "knock", condition, ESPEAK)
    assert np.array_equal(render(tmp_path / "a", noise).audio, render(tmp_path / "b", noise).audio)


def test_a_clip_can_be_heard_in_a_noise_that_was_there_all_along(tmp_path: Path):
    """``--background-s``: the VAD first hears the clip's own background (its lead, looped), as in a
    call where the noise was there all along; its noise floor has risen to the noise, so the
    background alone is no longer voice, where at the noise's start it is."""
    rendered = render(tmp_path, spec.Clip("pause", "after and", "snr10", ESPEAK))
    lead = (rendered.start - BACKGROUND_CLEAR) // FRAME
    at_its_start = frames_of(rendered, VadConfig()).voiced[:lead]
    all_along = frames_of(rendered, VadConfig(), background_s=8.0).voiced[:lead]
    assert any(at_its_start) and not any(all_along), (at_its_start, all_along)


def _examples(seed: int) -> Examples:
    """Features of the shape the corpus gives (the training's input), made from a seed."""
    rng = np.random.default_rng(seed)
    examples = Examples()
    for label, shift in (("backchannel", 0.0), ("interruption", 1.0), ("noise", -1.0)):
        examples.overlap += [(rng.normal(shift, 1.0, len(OVERLAP_FEATURES)), label) for _ in range(40)]
    for label, shift in (("complete", 1.0), ("open", -1.0)):
        examples.pauses += [JudgedPause("s", rng.normal(shift, 1.0, len(PAUSE_FEATURES)), label, False)
                            for _ in range(40)]
    for label, shift in (("backchannel", -1.0), ("interruption", 1.0), ("noise", -2.0)):
        rows = [(rng.normal(shift, 1.0, len(SOUND_FEATURES)), label) for _ in range(40)]
        examples.sound += rows
        examples.first_sound += rows[::4]
    return examples


def test_training_is_deterministic_and_the_file_loads_back(tmp_path: Path):
    write(train(_examples(7)), tmp_path / "a.json")
    write(train(_examples(7)), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    write(train(_examples(8)), tmp_path / "c.json")
    assert (tmp_path / "c.json").read_bytes() != (tmp_path / "a.json").read_bytes()  # the data counts
    models = TurnModels.load(tmp_path / "a.json")
    assert models.overlap.classes == ("backchannel", "interruption", "noise")
    assert 0.5 <= models.complete_at < 1
    assert models.sound is not None and models.sound.classes == ("interruption", "other")
    # the hold is set where at most HOLD_BUDGET of the interruptions' first readings are held
    firsts = [x for x, label in _examples(7).first_sound if label == "interruption"]
    held = sum(models.sound.probabilities(x)["other"] >= models.hold_at for x in firsts)
    assert 0 < models.hold_at <= 1 and held <= HOLD_BUDGET * len(firsts)
    without = _examples(7)
    without.sound, without.first_sound = [], []  # no overlap read at interrupt_ms: no sound model
    assert train(without).sound is None
    data = json.loads((tmp_path / "a.json").read_text())
    data["pause"]["features"] = data["pause"]["features"][:-1]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="features are not this duplex's"):
        TurnModels.load(tmp_path / "bad.json")


def test_the_sound_net_reads_with_numpy_what_it_learned_and_draws_a_line_no_straight_one_can():
    """Sounds whose class is the XOR of two measures (a steady pitch is a hum when the level
    repeats, speech when it does not): the net, applied with numpy, learns it; its weights
    written to JSON read back to the same probabilities."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(400):
        x = rng.normal(0.0, 0.3, len(SOUND_FEATURES))
        a, b = rng.integers(0, 2, 2)
        x[:2] += (2 * a - 1, 2 * b - 1)
        rows.append((x, "interruption" if a == b else "other"))
    net = fit_mlp(rows, SOUND_FEATURES)
    assert net.classes == ("interruption", "other")
    right = sum((net.probabilities(x)["other"] >= 0.5) == (label == "other") for x, label in rows)
    assert right >= 0.95 * len(rows)  # a straight line gets about half of XOR right
    back = MLPModel.from_json(json.loads(json.dumps(net.to_json())))
    for x, _ in rows[:20]:
        assert back.probabilities(x)["other"] == pytest.approx(net.probabilities(x)["other"], abs=1e-12)
    with pytest.raises(ValueError, match="two classes"):
        fit_mlp([(x, "other") for x, _ in rows[:10]], SOUND_FEATURES)


def _sentence(name: str, rng: np.random.Generator, marked: bool) -> list[JudgedPause]:
    """Pauses of one sentence: the first feature tells complete from open, reversed (and told by the
    second feature alone) where ``marked``."""
    out = []
    for label, sign in (("complete", 1.0), ("open", -1.0)):
        for _ in range(30):
            x = rng.normal(0.0, 0.3, len(PAUSE_FEATURES))
            x[0] += -sign if marked else sign
            x[1] = 3.0 * sign if marked else 0.0
            out.append(JudgedPause(name, x, label, rules_end=label == "open"))
    return out


def test_a_sentence_is_judged_by_a_reading_trained_without_it():
    rng = np.random.default_rng(3)
    training = [p for name in ("a", "b", "c") for p in _sentence(name, rng, False)] + _sentence("odd", rng, True)
    judged = [p for name in ("a", "odd") for p in _sentence(name, rng, name == "odd")]
    folds = sentence_folds(training, judged)
    assert list(folds) == ["a", "odd"]
    odd, plain = folds["odd"], folds["a"]
    # only a reading that read "odd" (the second feature) hears its reversed pauses
    assert odd[EVERY].opens_ended <= 3 and odd[EVERY].completes_ended >= 27
    assert odd[WITHOUT].opens_ended >= 27 and odd[WITHOUT].completes_ended <= 3
    for way in (EVERY, WITHOUT):
        assert plain[way].opens_ended <= 3 and plain[way].completes_ended >= 27
    assert plain[RULES].opens_ended == plain[RULES].opens == 30 and plain[RULES].completes_ended == 0
    report = print_folds(folds)
    assert report["totals"][WITHOUT]["opens"] == 60  # type: ignore[index]

"""The learned end-of-turn decision on clips of the synthetic corpus, in process on stream time (the
session's VAD, turn detector and end-of-turn judge; Whisper-base and Smart Turn as the local
pipeline runs them): speakers of the held-out part, one per synthesiser. A mid-sentence pause is
not taken over, even where Smart Turn hears a sentence's end and Whisper writes one ("I would like
to order." before "a large mango tea ..."), and a complete turn ends at the first check."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex.session.turn_model import read_pause, shipped_models
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.ears import Ears
from duplex_tools.turn_corpus.evaluate import Settings
from duplex_tools.turn_corpus.render import render
from duplex_tools.turn_corpus.simulate import frames_of, run_turn

pytestmark = pytest.mark.skipif(shipped_models() is None, reason="duplex/session/turn_model.json is not there")

HELD_OUT = {s.synth: s for s in reversed(spec.speakers_of("held-out"))}  # the first of each synthesiser
SETTINGS = Settings()


def _turn(tmp_path: Path, synth: str, category: str, variant: str, learned: bool):
    rendered = render(tmp_path, spec.Clip(category, variant, "clean", HELD_OUT[synth]))
    frames = frames_of(rendered, SETTINGS.vad)
    run = run_turn(frames, Ears(tmp_path), SETTINGS.vad, SETTINGS.semantic, read_pause if learned else None)
    return rendered, run


@pytest.mark.parametrize(("synth", "variant"), [("espeak", "after and"), ("piper", "after a")])
def test_a_mid_sentence_pause_is_not_taken_over(tmp_path: Path, synth: str, variant: str):
    rendered, run = _turn(tmp_path, synth, "pause", variant, learned=True)
    assert rendered.pause_at is not None and run.decided_ms is not None
    resumed_ms = rendered.pause_at // 16 + round(1000 * spec.PAUSE_S)
    assert run.judged and run.judged[0][0] <= rendered.pause_at // 16 + 20  # the pause was judged ...
    assert run.decided_ms > resumed_ms  # ... and the turn ended only after the caller went on


def test_the_rules_take_over_the_pause_the_learned_decision_waits_through(tmp_path: Path):
    # Smart Turn hears "I would like to order" as complete and Whisper closes it with a "."
    rendered, run = _turn(tmp_path, "piper", "pause", "after a", learned=False)
    assert rendered.pause_at is not None and run.decided_ms is not None
    assert run.decided_ms < rendered.pause_at // 16 + round(1000 * spec.PAUSE_S)


@pytest.mark.parametrize(("synth", "variant"), [("espeak", "menu"), ("piper", "order")])
def test_a_complete_turn_ends_at_the_first_check(tmp_path: Path, synth: str, variant: str):
    rendered, run = _turn(tmp_path, synth, "smooth", variant, learned=True)
    assert run.decided_ms is not None
    end_ms = rendered.end // 16
    # judged check_ms after the end of speech (give or take the VAD's frames), not the longest pause
    assert run.decided_ms - end_ms <= SETTINGS.semantic.check_ms + 3 * 20

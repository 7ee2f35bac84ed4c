"""Answering-machine detection (duplex/edge/phone/amd.py): units on made signals, and a small
held-out set of generated greetings (voices and wordings the thresholds were not tuned on:
``duplex bench amd`` scores the full set) scored in process."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from duplex.edge.phone.amd import AmdSettings, AmdVerdict, AnsweringMachineDetector
from duplex_tools.bench.amd import HUMAN, MACHINE, greeting, score, summary

RATE = 8000
FRAME = 160


def feed_all(detector: AnsweringMachineDetector, audio: np.ndarray, chunk: int = FRAME) -> list:
    made = [detector.feed(audio[i:i + chunk]) for i in range(0, len(audio), chunk)]
    return [d for d in made if d is not None]


def tone(seconds: float, hz: float, level: float = 0.3, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (level * 32767 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def test_silence_is_a_person_waiting_decided_at_the_deadline_once():
    detector = AnsweringMachineDetector(RATE)
    made = feed_all(detector, np.zeros(RATE * 5, np.int16), chunk=333)  # odd chunks: frames are carried
    assert len(made) == 1 and made[0].verdict is AmdVerdict.HUMAN
    assert made[0].decided_ms == AmdSettings().decide_by_ms and not made[0].beep


@pytest.mark.parametrize("rate", [8000, 16000])  # a G.711 leg's rate, and the session's (a CallAgent's input)
def test_a_beep_is_a_machine_and_its_end_is_found_to_the_frame(rate):
    detector = AnsweringMachineDetector(rate)
    audio = np.concatenate([np.zeros(rate // 2, np.int16), tone(0.5, 1400, rate=rate), np.zeros(rate, np.int16)])
    (decision,) = feed_all(detector, audio, chunk=rate // 50)
    assert decision.verdict is AmdVerdict.MACHINE and decision.beep
    assert 500 + AmdSettings().beep_ms <= decision.decided_ms <= 500 + AmdSettings().beep_ms + 2 * 20
    assert detector.beep_end_ms is not None and abs(detector.beep_end_ms - 1000) <= 20
    event = decision.event()
    assert (event.verdict, event.beep, event.decided_ms) == ("machine", True, decision.decided_ms)


def test_tones_outside_the_beep_band_or_too_short_are_no_beep():
    for audio in (tone(0.6, 400), tone(0.6, 3000), tone(0.1, 1000)):
        detector = AnsweringMachineDetector(RATE)
        feed_all(detector, np.concatenate([audio, np.zeros(RATE * 4, np.int16)]))
        assert detector.beeps.seen_ms is None


def test_bad_sample_rate_is_refused():
    with pytest.raises(ValueError, match="webrtcvad"):
        AnsweringMachineDetector(11025)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng missing")
def test_held_out_voices_and_wordings_score_at_least_0_9_within_3_s():
    clips = [greeting(voice, text, machine, seed=7)
             for voice in ("en-gb-scotland", "en-029")
             for machine, texts in ((False, HUMAN["test"]), (True, MACHINE["test"])) for text in texts]
    results = [score(clip) for clip in clips]
    found = summary(results)
    assert found["accuracy"] >= 0.9, [(r.greeting.voice, r.greeting.text, r.verdict) for r in results if not r.correct]
    assert found["decided_max_ms"] <= 3000
    assert found["beeps_found"] == found["machines"] and found["beep_end_off_max_ms"] <= 40

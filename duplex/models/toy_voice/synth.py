"""A tiny formant synthesiser: text -> voiced, speech-like syllables (no model weights).

Each vowel group of a word becomes one syllable: a glottal-pulse-like harmonic series at a
falling pitch, shaped by three vowel formants, under an attack/decay envelope. Voice activity
detectors classify it as speech, which is what the edge's barge-in and echo tests need.
"""

from __future__ import annotations

import re

import numpy as np

SAMPLE_RATE = 16000
SYLLABLE_MS = 170
_VOWEL_FORMANTS = {  # rough F1, F2, F3 (Hz) of English vowels
    "a": (730, 1090, 2440),
    "e": (530, 1840, 2480),
    "i": (270, 2290, 3010),
    "o": (570, 840, 2410),
    "u": (300, 870, 2240),
    "y": (400, 1900, 2600),
}
_VOWEL_GROUP = re.compile(r"[aeiouy]+")


def syllables(word: str) -> list[str]:
    """The vowel groups of a word (at least one, so every word is heard)."""
    groups = _VOWEL_GROUP.findall(word.lower())
    return groups or ["a"]


def _formant_gain(freqs: np.ndarray, formants: tuple[int, int, int]) -> np.ndarray:
    gain = np.zeros_like(freqs)
    for index, centre in enumerate(formants):
        bandwidth = 80.0 + 40.0 * index
        gain += (0.8 ** index) / (1.0 + ((freqs - centre) / bandwidth) ** 2)
    return gain


def syllable(vowels: str, pitch_hz: float, rng_phase: float, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """One voiced syllable of SYLLABLE_MS as float32 in [-1, 1]."""
    n = int(sample_rate * SYLLABLE_MS / 1000)
    t = np.arange(n) / sample_rate
    formants = _VOWEL_FORMANTS.get(vowels[0], _VOWEL_FORMANTS["a"])
    f0 = pitch_hz * (1.0 - 0.12 * t / t[-1])  # a falling contour sounds like speech
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate + rng_phase
    harmonics = np.arange(1, int(4000 // pitch_hz) + 1)
    gains = _formant_gain(harmonics * pitch_hz, formants) / harmonics**0.5
    wave = (gains[:, None] * np.sin(harmonics[:, None] * phase[None, :])).sum(axis=0)
    envelope = np.minimum(1.0, np.minimum(t / 0.025, (t[-1] - t) / 0.04 + 0.35))
    wave *= envelope
    return (0.3 * wave / (np.abs(wave).max() + 1e-9)).astype(np.float32)


def speak(word: str, index: int, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A word as concatenated syllables; ``index`` varies the pitch so words differ."""
    pitch = 110.0 + 25.0 * ((index * 7) % 5)
    parts = [syllable(v, pitch * (1 + 0.05 * k), 0.7 * k, sample_rate) for k, v in enumerate(syllables(word))]
    return np.concatenate(parts)

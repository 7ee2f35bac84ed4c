"""An overlap's sound, read without its words: per 20 ms frame its level, periodicity, pitch,
spectral flatness and spectral shape (``SoundTrace``), and the acoustic features
(``SOUND_FEATURES``) the learned sound reading (``turn_model``) reads at the moment the voiced
time alone would interrupt (``barge_in.interrupt_ms``, ``barge_in.sound: learned``).

Why these: a caller who takes the floor speaks on, in syllables with a moving pitch, one breath
group after another, the spectrum's shape moving as the mouth does; "mm-hmm, mm-hmm" and "yeah
yeah" are short bursts with gaps between them and a flat or falling contour, a hum holds one
shape; a keyboard, a knock or clicks are many short unpitched bursts; a laugh is even, repeated
syllables on one pitch; music holds its pitch with a steady level.
Everything here comes from the frames the session already holds (``TurnAudio``), with numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

RATE = 16_000
_MIN_LAG, _MAX_LAG = 40, 267  # 60-400 Hz at 16 kHz: a voice's pitch periods
_BAND_HZ = (200.0, 3400.0)  # what every line carries (the phone's band): flatness is read inside it
PITCHED = 0.6  # periodicity at/above which a frame has a pitch (a vowel near 1, a hiss near 0)
SHAPE_BANDS = 12  # bands of a frame's spectral shape (``_spectrum``): about a third of an octave each


def _peak(window: np.ndarray) -> tuple[float, int]:
    """The normalised autocorrelation's peak over a voice's pitch lags, and its lag."""
    x = np.asarray(window, np.float64)
    x = x - x.mean()
    n = len(x)
    if n <= _MAX_LAG or not np.any(x):
        return 0.0, 0
    spectrum = np.fft.rfft(x, 2 * n)
    ac = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    lags = np.arange(_MIN_LAG, min(_MAX_LAG, n - 1))
    norm = ac[lags] / (ac[0] * (n - lags) / n)
    best = int(np.argmax(norm))
    return float(max(0.0, norm[best])), int(lags[best])


def periodicity(window: np.ndarray) -> float:
    """How periodic ``window`` (int16 or float, >= 2 pitch periods) is: the normalised
    autocorrelation's peak over a voice's pitch lags (a vowel near 1, a knock or hiss near 0)."""
    return _peak(window)[0]


def spectrum_of(frame: np.ndarray) -> tuple[float, float]:
    """Spectral flatness and centroid (kHz) of ``frame`` within the phone band. Flatness is the
    power spectrum's geometric over its arithmetic mean: a hiss or a click near 1, a vowel or a
    chord near 0. The centroid is high for the hiss of "s", "t", "ch" (which sentences have and
    "mm-hmm", "yeah" mostly lack) and low for a hum."""
    flatness_, centroid, _ = _spectrum(frame)
    return flatness_, centroid


_SHAPE_EDGES_HZ = np.geomspace(_BAND_HZ[0], _BAND_HZ[1], SHAPE_BANDS + 1)


@dataclass(frozen=True)
class _Bins:
    """What reading a frame of one length needs, made once per length (every 20 ms frame of an
    overlap is read at every reading): its window, the phone band's bins and their frequencies,
    and each shape band's share of the bins (rows average a band's power)."""

    window: np.ndarray
    inside: np.ndarray
    freqs: np.ndarray
    bands: np.ndarray  # SHAPE_BANDS x bins

    @staticmethod
    @lru_cache(maxsize=8)
    def of(length: int) -> _Bins:
        freqs = np.fft.rfftfreq(length, 1 / RATE)
        member = np.array([(freqs >= low) & (freqs < high)
                           for low, high in zip(_SHAPE_EDGES_HZ[:-1], _SHAPE_EDGES_HZ[1:])], np.float64)
        inside = (freqs >= _BAND_HZ[0]) & (freqs <= _BAND_HZ[1])
        counts = np.maximum(member.sum(axis=1, keepdims=True), 1)  # a band too narrow for any bin reads 0
        return _Bins(np.hanning(length), inside, freqs[inside], member / counts)


def _spectrum(frame: np.ndarray) -> tuple[float, float, np.ndarray]:
    """``spectrum_of`` and the frame's spectral shape: its log power in ``SHAPE_BANDS`` bands
    spaced evenly in pitch across the phone band, less their mean (so the level does not count).
    Speech moves its shape from one frame to the next (a vowel's formants glide into a
    consonant's); a hum, a held "mm" and most noises keep it."""
    x = np.asarray(frame, np.float64)
    if len(x) < 2 or not np.any(x):
        return 1.0, 0.0, np.zeros(SHAPE_BANDS)
    bins = _Bins.of(len(x))
    power = np.abs(np.fft.rfft(x * bins.window)) ** 2
    band = power[bins.inside] + 1e-12
    centroid = float(np.dot(bins.freqs, band) / band.sum()) / 1000
    shape = np.log(bins.bands @ power + 1e-3)
    return float(np.exp(np.mean(np.log(band))) / np.mean(band)), centroid, shape - shape.mean()


def flatness(frame: np.ndarray) -> float:
    """Spectral flatness of ``frame`` within the phone band (``spectrum_of``)."""
    return spectrum_of(frame)[0]


def _level_db(frame: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(np.asarray(frame, np.float64) ** 2))) / 32768.0
    return 20.0 * math.log10(rms) if rms > 1e-6 else -120.0


@dataclass(frozen=True)
class SoundTrace:
    """The overlap's sound per frame (from its onset's prefix on): level (dBFS), periodicity,
    pitch (Hz, of the periodicity's peak; read only where periodic), spectral flatness, centroid
    (kHz) and shape (``_spectrum``), and the VAD's verdict."""

    levels: np.ndarray
    periodic: np.ndarray
    voiced: list[bool]
    pitch: np.ndarray
    flat: np.ndarray
    centroid: np.ndarray
    shapes: np.ndarray  # frames x SHAPE_BANDS

    @classmethod
    def of(cls, frames: list[tuple[np.ndarray, bool]]) -> SoundTrace:
        """``frames``: int16 16 kHz samples and the VAD's verdict (``TurnAudio``'s frames)."""
        return TraceBuilder().trace(frames)


class _FrameRead(NamedTuple):
    """One frame of a ``SoundTrace``."""

    level: float
    periodic: float
    pitch: float
    flat: float
    centroid: float
    shape: np.ndarray


def _read_frame(previous: np.ndarray, frame: np.ndarray) -> _FrameRead:
    """``frame`` read (its periodicity over it and the frame before, for two pitch periods)."""
    strength, lag = _peak(np.concatenate([previous, frame]))
    flatness_, centroid, shape = _spectrum(frame)
    return _FrameRead(_level_db(frame), strength, RATE / lag if lag else 0.0, flatness_, centroid, shape)


class TraceBuilder:
    """One overlap's ``SoundTrace`` as its frames grow, each frame read once: read whole at every
    reading, a sound costs the session's event loop 0.16 ms a frame (24 ms for 3 s, every
    ``RECHECK_MS`` while it is held). Frames are known by identity: frames that no longer begin
    with those read (a new overlap) are read from where they part."""

    def __init__(self) -> None:
        self._frames: list[np.ndarray] = []
        self._reads: list[_FrameRead] = []

    def trace(self, frames: list[tuple[np.ndarray, bool]]) -> SoundTrace:
        same = 0
        for (frame, _), known in zip(frames, self._frames):
            if frame is not known:
                break
            same += 1
        del self._frames[same:], self._reads[same:]
        for frame, _ in frames[same:]:
            previous = self._frames[-1] if self._frames else np.zeros(0, np.int16)
            self._reads.append(_read_frame(previous, frame))
            self._frames.append(frame)
        reads = self._reads
        return SoundTrace(np.asarray([r.level for r in reads]), np.asarray([r.periodic for r in reads]),
                          [voiced for _, voiced in frames], np.asarray([r.pitch for r in reads]),
                          np.asarray([r.flat for r in reads]), np.asarray([r.centroid for r in reads]),
                          np.asarray([r.shape for r in reads]).reshape(len(reads), SHAPE_BANDS))

    def clear(self) -> None:
        """The overlap is over: its frames are not held any longer."""
        self._frames, self._reads = [], []


_MEASURES = ("sound_s", "voiced_share", "bursts_per_s", "longest_gap_s", "periodic_mean", "pitched_share",
                  "pitch_spread", "pitch_step", "flatness_mean", "flatness_spread", "level_above_floor",
                  "level_spread", "level_flux", "level_trend", "level_repeat", "centroid_mean", "centroid_spread",
                  "hiss_share", "shape_flux", "shape_spread")
# the measures and their squares: a linear model of both draws a curved line between the classes
# (a middling pitch spread or level is speech; a very flat or very jumpy one is not)
SOUND_FEATURES = _MEASURES + tuple(f"{name}^2" for name in _MEASURES)
HISS_KHZ = 1.8  # a loud frame whose centroid is above this is a consonant's hiss (or a noise's)
_REPEAT_LAGS = (6, 30)  # frames (120-600 ms): one syllable to one "uh-huh" apart
_REPEAT_OVERLAP = 8  # frames the contour and its shifted copy share, at the least
_CONTOUR_DB = 40.0  # the level contour is read this far below its peak (quieter is the floor)


def _runs(flags: list[bool]) -> list[tuple[bool, int]]:
    """``flags`` as runs: (value, length)."""
    runs: list[tuple[bool, int]] = []
    for flag in flags:
        if runs and runs[-1][0] == flag:
            runs[-1] = (flag, runs[-1][1] + 1)
        else:
            runs.append((flag, 1))
    return runs


def _repeat(contour: np.ndarray) -> float:
    """How well the level contour matches itself shifted by a syllable or more (its correlation's
    peak over ``_REPEAT_LAGS``): "uh-huh, uh-huh", "yeah yeah", a laugh, a beat repeat; speech that
    takes the floor does not."""
    x = np.maximum(contour, contour.max() - _CONTOUR_DB)
    x = x - x.mean()
    best = 0.0
    for lag in range(_REPEAT_LAGS[0], min(_REPEAT_LAGS[1], len(x) - _REPEAT_OVERLAP) + 1):
        a, b = x[:-lag], x[lag:]
        energy = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
        if energy > 0:
            best = max(best, float(np.dot(a, b)) / energy)
    return best


def sound_features(trace: SoundTrace) -> np.ndarray:
    """The sound's features (``SOUND_FEATURES``), over its span (first to last voiced frame)."""
    voiced = np.flatnonzero(trace.voiced)
    if not voiced.size:
        return np.zeros(len(SOUND_FEATURES))
    measures = _measures(trace, voiced)
    return np.concatenate([measures, measures**2])


def _measures(trace: SoundTrace, voiced: np.ndarray) -> np.ndarray:
    """``_MEASURES`` of a sound with a voiced frame at least."""
    first, last = int(voiced[0]), int(voiced[-1]) + 1
    span = trace.voiced[first:last]
    sound_s = 0.02 * len(span)
    runs = _runs(span)
    bursts = sum(1 for flag, _ in runs if flag)
    gap = max((n for flag, n in runs if not flag), default=0)
    periodic = trace.periodic[voiced]
    pitched = voiced[periodic >= PITCHED]
    semitones = 12 * np.log2(np.maximum(trace.pitch[pitched], 1.0)) if pitched.size else np.zeros(0)
    spread = float(semitones.std()) / 12 if len(semitones) >= 3 else 0.0
    steps = [abs(semitones[i + 1] - semitones[i]) for i in range(len(semitones) - 1)
             if pitched[i + 1] == pitched[i] + 1]  # from one frame to the next
    step = float(np.median(np.minimum(steps, 12.0))) / 12 if steps else 0.0
    levels = trace.levels[first:last]
    voiced_levels = trace.levels[voiced]
    third = max(1, len(levels) // 3)
    return np.array([
        sound_s, float(np.mean(span)), bursts / max(sound_s, 0.1), 0.02 * gap,
        float(periodic.mean()), pitched.size / voiced.size, spread, step,
        float(trace.flat[voiced].mean()), float(trace.flat[voiced].std()),
        float(voiced_levels.mean() - trace.levels.min()) / 10, float(voiced_levels.std()) / 10,
        float(np.mean(np.abs(np.diff(levels)))) / 10 if len(levels) > 1 else 0.0,
        float(levels[-third:].mean() - levels[:third].mean()) / 10, _repeat(levels),
        float(trace.centroid[voiced].mean()), float(trace.centroid[voiced].std()), _hiss_share(trace, first, last),
        *_shape_motion(trace, voiced),
    ], np.float64)


_SHAPE_FLOOR_DB = 30.0  # the shape is read on voiced frames this far below the loudest, at most


def _shape_motion(trace: SoundTrace, voiced: np.ndarray) -> tuple[float, float]:
    """How the spectral shape moves over the sound's loud voiced frames: from one frame to the
    next (the RMS of the change, over neighbouring frames) and across them all (the bands'
    spread): speech's articulation against a hum's or a noise's steady shape."""
    levels = trace.levels[voiced]
    loud = voiced[levels >= levels.max() - _SHAPE_FLOOR_DB]
    if loud.size < 2:
        return 0.0, 0.0
    shapes = trace.shapes[loud]
    steps = [float(np.sqrt(np.mean((trace.shapes[a] - trace.shapes[b]) ** 2)))
             for a, b in zip(loud[:-1], loud[1:]) if b == a + 1]
    return (float(np.mean(steps)) if steps else 0.0), float(shapes.std(axis=0).mean())


def _hiss_share(trace: SoundTrace, first: int, last: int) -> float:
    """The share of the span's frames well above the floor whose centroid is a hiss's."""
    levels = trace.levels[first:last]
    loud = levels >= trace.levels.min() + 10
    return float(np.mean(loud & (trace.centroid[first:last] >= HISS_KHZ)))

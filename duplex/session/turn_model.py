"""Learned turn-taking decisions: small models (weights in one JSON file, applied with numpy) of
what an overlap is (backchannel / interruption / noise) once its words are heard and of whether a
pause ends a complete turn (linear), and of whether an overlap's sound alone is a caller taking
the floor (a net of one hidden layer, read when its time would interrupt: ``barge_in.sound:
learned``). Trained from a synthetic corpus of many voices, rooms and lines by ``duplex bench
turn-taking --train`` (tools/duplex_tools/turn_corpus); the default server needs nothing but
numpy to apply them.

Their inputs are what the session has at the decision: the sound since the overlap's onset (per
frame: level, periodicity, pitch, flatness, the VAD's verdict: ``overlap_sound.SoundTrace``), the
ASR's words, and for a pause Smart Turn's probability and the turn's words. The word lists read
are ``words.py``'s."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Self

import numpy as np

from duplex.session.overlap_sound import SOUND_FEATURES, SoundTrace, periodicity, sound_features
from duplex.session.overlap_words import MS_PER_WORD, Said, is_backchannel, spoken_words
from duplex.session.words import BACKCHANNELS, FLOOR_WORDS, HANGING_WORDS, NEVER_LAST, asks, closes

OVERLAP_CLASSES = ("backchannel", "interruption", "noise")
PAUSE_CLASSES = ("open", "complete")
OTHER_AT = 0.5  # P(other) of the sound reading from which a backchannel or a noise is the likelier
MODEL_PATH = Path(__file__).with_name("turn_model.json")
# what each class of overlap says to the listening barge-in (``overlap.Listening``)
SAID = {"backchannel": Said.BACKCHANNEL, "interruption": Said.FLOOR, "noise": Said.NOTHING}
__all__ = ["SoundTrace", "periodicity"]  # read here by the corpus tools and the tests

OVERLAP_FEATURES = ("voiced_s", "sound_s", "voiced_share", "periodic_mean", "periodic_max", "periodic_rise",
                    "level_above_floor", "level_spread", "words", "all_backchannel", "floor_word", "other_words",
                    "no_words", "words_per_voiced_s")


def overlap_features(trace: SoundTrace, voiced_ms: int, text: str) -> np.ndarray:
    """The overlap's features (``OVERLAP_FEATURES``) from its sound so far and its words."""
    voiced = np.flatnonzero(trace.voiced)
    levels, periodic = trace.levels, trace.periodic
    if voiced.size:
        span = trace.voiced[voiced[0]:voiced[-1] + 1]
        sound_s, share = 0.02 * len(span), float(np.mean(span))
        p = periodic[voiced]
        half = max(1, len(p) // 2)
        rise = float(p[half:].mean() - p[:half].mean()) if len(p) > 1 else 0.0
        above = float(levels[voiced].mean() - levels.min()) / 10.0
        spread = float(levels[voiced].std()) / 10.0
        p_mean, p_max = float(p.mean()), float(p.max())
    else:
        sound_s = share = rise = above = spread = p_mean = p_max = 0.0
    words = spoken_words(text)
    credible = len(words) * MS_PER_WORD <= max(voiced_ms, 1)
    backchannel = bool(words) and is_backchannel(words)
    floor = any(word in FLOOR_WORDS for word in words)
    others = sum(1 for word in words if (word,) not in BACKCHANNELS)
    return np.array([voiced_ms / 1000, sound_s, share, p_mean, p_max, rise, above, spread, min(len(words), 8) / 4,
                     float(backchannel), float(floor), min(others, 8) / 4, float(not words),
                     float(credible) * len(words) / max(voiced_ms / 1000, 0.1) / 10], np.float64)


PAUSE_FEATURES = ("probability", "logit", "last_never", "last_hanging", "asks", "closes", "comma", "trails_off",
                  "words", "no_words")


def pause_features(probability: float, text: str) -> np.ndarray:
    """A pause's features (``PAUSE_FEATURES``) from Smart Turn's probability and the turn's words."""
    words = [w for w in text.lower().replace(",", " ").replace(".", " ").replace("?", " ").split() if w]
    last = words[-1].strip("!\"'") if words else ""
    p = min(max(probability, 1e-4), 1 - 1e-4)
    trails = text.rstrip(" \"')").endswith(("...", "\u2026"))
    return np.array([p, math.log(p / (1 - p)) / 4, float(last in NEVER_LAST), float(last in HANGING_WORDS),
                     float(asks(text)), float(closes(text) and not trails), float(text.rstrip().endswith(",")),
                     float(trails), min(len(words), 20) / 10, float(not words)], np.float64)


class _Weights:
    """What both kinds of model share: the inputs standardised by the training part's mean and
    scale, and the JSON they are written as (``to_json``: names as lists, numbers as nested lists;
    ``KIND`` says which model reads it back)."""

    KIND = ""
    mean: np.ndarray
    scale: np.ndarray

    def standardised(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.scale

    def to_json(self) -> dict[str, object]:
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        return {"kind": self.KIND, **data} if self.KIND else data

    @classmethod
    def from_json(cls, data: dict) -> Self:
        values = {f.name: tuple(data[f.name]) if f.name in _NAME_FIELDS
                  else float(data[f.name]) if f.type == "float" else np.asarray(data[f.name], np.float64)
                  for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**values)


_NAME_FIELDS = ("classes", "features")


def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value) if isinstance(value, tuple) else value


def _logistic(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-min(max(z, -500.0), 500.0)))  # clamped: exp overflows past ~709


@dataclass(frozen=True)
class LinearModel(_Weights):
    """Multinomial logistic regression: standardise, then softmax(W x + b)."""

    classes: tuple[str, ...]
    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # classes x features
    bias: np.ndarray

    def probabilities(self, x: np.ndarray) -> dict[str, float]:
        z = self.weights @ self.standardised(x) + self.bias
        if len(self.classes) == 2 and self.weights.shape[0] == 1:  # binary: one row, P(classes[1])
            p = _logistic(float(z[0]))
            return {self.classes[0]: 1 - p, self.classes[1]: p}
        e = np.exp(z - z.max())
        return dict(zip(self.classes, (e / e.sum()).tolist()))


@dataclass(frozen=True)
class MLPModel(_Weights):
    """A small neural net of two classes: standardise, one hidden layer (ReLU), then the logistic
    P(classes[1]). The sound reading's shape: an overlap's measures tell a caller taking the
    floor from a backchannel or a noise by how they combine (a steady pitch is a hum when the
    level repeats, speech when it does not), which a straight line through them cannot draw."""

    KIND = "mlp"
    classes: tuple[str, ...]
    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    hidden_weights: np.ndarray  # hidden x features
    hidden_bias: np.ndarray
    out_weights: np.ndarray  # hidden
    out_bias: float

    def probabilities(self, x: np.ndarray) -> dict[str, float]:
        hidden = np.maximum(0.0, self.hidden_weights @ self.standardised(x) + self.hidden_bias)
        p = _logistic(float(self.out_weights @ hidden) + self.out_bias)
        return {self.classes[0]: 1 - p, self.classes[1]: p}


def model_from_json(data: dict) -> LinearModel | MLPModel:
    """A model as ``to_json`` wrote it (a file without ``kind`` holds a linear one)."""
    return MLPModel.from_json(data) if data.get("kind") == MLPModel.KIND else LinearModel.from_json(data)


@dataclass(frozen=True)
class TurnModels:
    overlap: LinearModel
    pause: LinearModel
    complete_at: float = 0.5  # P(complete) at/above which a pause ends the turn
    sound: LinearModel | MLPModel | None = None  # the overlap's sound alone: P(other) (a backchannel or a noise)
    hold_at: float = 1.0  # P(other) at/above which a sound is held for its words at interrupt_ms

    @classmethod
    def load(cls, path: Path = MODEL_PATH) -> TurnModels:
        """The models in ``path`` (a ValueError names what is wrong with it)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        overlap, pause = LinearModel.from_json(data["overlap"]), LinearModel.from_json(data["pause"])
        sound = model_from_json(data["sound"]) if "sound" in data else None
        if overlap.features != OVERLAP_FEATURES or pause.features != PAUSE_FEATURES or (
                sound is not None and sound.features != SOUND_FEATURES):
            raise ValueError(f"{path}: its features are not this duplex's (retrain: duplex bench turn-taking --train)")
        return cls(overlap, pause, float(data.get("complete_at", 0.5)), sound, float(data.get("hold_at", 1.0)))

    def overlap_kind(self, trace: SoundTrace, voiced_ms: int, text: str) -> str:
        probabilities = self.overlap.probabilities(overlap_features(trace, voiced_ms, text))
        return max(probabilities, key=lambda c: probabilities[c])

    def pause_complete(self, probability: float, text: str) -> float:
        return self.pause.probabilities(pause_features(probability, text))["complete"]

    def sound_other(self, trace: SoundTrace) -> float:
        """P(the sound is a backchannel or a noise, not a caller taking the floor); 0 without the model."""
        return 0.0 if self.sound is None else self.sound.probabilities(sound_features(trace))["other"]

    def sound_holds(self, trace: SoundTrace) -> bool:
        """Whether the sound is held for its words instead of interrupting at ``interrupt_ms``."""
        return self.sound is not None and self.sound_other(trace) >= self.hold_at

    def sounds_other(self, trace: SoundTrace) -> bool:
        """Whether the sound is more likely a backchannel or a noise than a caller taking the floor
        (its words must then come faster to count: ``barge_in.max_voiced_ms_per_word_other``)."""
        return self.sound is not None and self.sound_other(trace) >= OTHER_AT


@lru_cache(maxsize=1)
def shipped_models() -> TurnModels | None:
    """The models that ship with duplex (``turn_model.json``); None where it is missing (the
    sessions then decide by the rules)."""
    return TurnModels.load(MODEL_PATH) if MODEL_PATH.is_file() else None


def read_pause(probability: float, text: str) -> bool | None:
    """The shipped model's reading of a pause (complete or not); None without the model."""
    models = shipped_models()
    return None if models is None else models.pause_complete(probability, text) >= models.complete_at


def read_other(trace: SoundTrace) -> bool:
    """The shipped model's reading of an overlap's sound so far (from its onset's prefix on): True
    when a backchannel or a noise is the likelier; False without the model."""
    models = shipped_models()
    return models is not None and models.sounds_other(trace)


def read_overlap(trace: SoundTrace, text: str, voiced_ms: int) -> Said | None:
    """What the shipped model hears an overlap say, from its sound (from its onset's prefix on)
    and words; None without the model."""
    models = shipped_models()
    return None if models is None else SAID[models.overlap_kind(trace, voiced_ms, text)]


def read_sound(trace: SoundTrace) -> bool:
    """The shipped model's reading of an overlap's sound alone (from its onset's prefix on): True
    when it hears a backchannel or a noise (hold it for the words); False without the model (the
    voiced time decides)."""
    models = shipped_models()
    return models is not None and models.sound_holds(trace)

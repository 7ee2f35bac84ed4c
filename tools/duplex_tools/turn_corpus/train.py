"""The learned turn-taking decisions (``duplex.session.turn_model``), trained from one part of the
corpus by one command (``duplex bench turn-taking --train``): multinomial logistic regression for
the overlap's words and the pause, a net of one hidden layer for the overlap's sound
(scikit-learn, both L-BFGS from a fixed seed: deterministic), over the features the decisions
read, standardised.

The pause's threshold is picked on the same part: the lowest P(complete) at which at most
``OPEN_BUDGET`` of its judged pauses that were not the turn's end would end it (a trade of pauses
taken over against complete turns left waiting for the longest pause). The sound reading's
(``sound_features`` at ``interrupt_ms``: a caller taking the floor, or "other": a backchannel or a
noise) likewise: the lowest P(other) at which at most ``HOLD_BUDGET`` of the part's interruptions
would be held for their words at their first reading. A held interruption is cut at a later
reading or by its words, so it costs time, not the floor; on the dev part, each speaker judged by
a net trained without them, budgets of 0.2, 0.3 and 0.4 cut backchannels 0.186, 0.170 and 0.162
of the time and honoured interruptions alike (0.948), while the verdict's p95 grew 1.9, 2.0 and
2.1 s: 0.2 keeps it nearest the linear reading's. Written as JSON weights the server applies with
numpy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from duplex.session.overlap_sound import SOUND_FEATURES
from duplex.session.turn_model import OVERLAP_FEATURES, PAUSE_FEATURES, LinearModel, MLPModel, TurnModels
from duplex_tools.turn_corpus.evaluate import Examples

OPEN_BUDGET = 0.10  # pauses of the training part that are not the end which the pause model may end
HOLD_BUDGET = 0.20  # interruptions of the training part the sound reading may hold for their words (first reading)


def fit(rows: list[tuple[np.ndarray, str]], features: tuple[str, ...], c: float = 1.0) -> LinearModel:
    from sklearn.linear_model import LogisticRegression

    x, y, mean, scale = _standardised(rows)
    model = LogisticRegression(C=c, max_iter=5000, class_weight="balanced")
    model.fit((x - mean) / scale, y)
    return LinearModel(tuple(str(k) for k in model.classes_), features, mean, scale,
                       np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64))


SOUND_HIDDEN = 32  # the sound reading's hidden units
SOUND_ALPHA = 1.0  # ... and its L2 penalty: picked on dev by speaker-grouped cross-validation


def fit_mlp(rows: list[tuple[np.ndarray, str]], features: tuple[str, ...], hidden: int = SOUND_HIDDEN,
            alpha: float = SOUND_ALPHA) -> MLPModel:
    """A net of one hidden layer for two classes, trained with L-BFGS from a fixed seed (full
    batches: the same examples give the same weights)."""
    from sklearn.neural_network import MLPClassifier

    x, y, mean, scale = _standardised(rows)
    if len(set(y)) != 2:
        raise ValueError(f"the net reads two classes, the examples have {sorted(set(y))}")
    model = MLPClassifier((hidden,), activation="relu", solver="lbfgs", alpha=alpha, max_iter=5000, random_state=0)
    model.fit((x - mean) / scale, y)
    (hidden_weights, out_weights), (hidden_bias, out_bias) = model.coefs_, model.intercepts_
    return MLPModel(tuple(str(k) for k in model.classes_), features, mean, scale,
                    np.asarray(hidden_weights.T, np.float64), np.asarray(hidden_bias, np.float64),
                    np.asarray(out_weights[:, 0], np.float64), float(out_bias[0]))


def _standardised(rows: list[tuple[np.ndarray, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The examples as arrays, with each feature's mean and scale."""
    if not rows:
        raise ValueError("no examples to train on")
    x = np.stack([row for row, _ in rows])
    y = np.array([label for _, label in rows])
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    return x, y, mean, scale


def pick_threshold(pause: LinearModel, rows: list[tuple[np.ndarray, str]]) -> float:
    opens = sorted(pause.probabilities(x)["complete"] for x, label in rows if label == "open")
    if not opens:
        return 0.5
    allowed = int(OPEN_BUDGET * len(opens))  # this many open pauses may score at/above it
    return float(round(min(0.99, max(0.5, opens[len(opens) - 1 - allowed] + 1e-6)), 6))


def pick_hold(sound: LinearModel | MLPModel, rows: list[tuple[np.ndarray, str]]) -> float:
    """The lowest P(other) at which at most ``HOLD_BUDGET`` of the interruptions (``rows``: their
    first readings) would be held."""
    floors = sorted(sound.probabilities(x)["other"] for x, label in rows if label == "interruption")
    if not floors:
        return 1.0
    allowed = int(HOLD_BUDGET * len(floors))
    # no floor at 0.5: the net's probabilities are sharp, so the budget, not an even chance, sets the line
    return float(round(min(1.0, floors[len(floors) - 1 - allowed] + 1e-6), 6))


def train(examples: Examples) -> TurnModels:
    overlap = fit(examples.overlap, OVERLAP_FEATURES)
    pause = fit(examples.pause, PAUSE_FEATURES)
    complete_at = pick_threshold(pause, examples.pause)
    if not examples.sound:  # no overlap was read at interrupt_ms: the sound's time decides alone
        return TurnModels(overlap, pause, complete_at)
    sound = fit_mlp(_floor_or_other(examples.sound), SOUND_FEATURES)
    return TurnModels(overlap, pause, complete_at, sound, pick_hold(sound, _floor_or_other(examples.first_sound)))


def _floor_or_other(rows: list[tuple[np.ndarray, str]]) -> list[tuple[np.ndarray, str]]:
    return [(x, "interruption" if category == "interruption" else "other") for x, category in rows]


def write(models: TurnModels, path: Path) -> None:
    payload = {"comment": "made by `duplex bench turn-taking --train` (tools/duplex_tools/turn_corpus/train.py)",
               "complete_at": models.complete_at, "overlap": models.overlap.to_json(), "pause": models.pause.to_json()}
    if models.sound is not None:
        payload |= {"hold_at": models.hold_at, "sound": models.sound.to_json()}
    text = json.dumps(payload, indent=1)
    Path(path).write_text(_rounded(text) + "\n", encoding="utf-8")


def _rounded(text: str) -> str:
    """Floats to 8 significant digits: the file reads the same on every machine's last bits."""
    data = json.loads(text, parse_float=lambda s: float(f"{float(s):.8g}"))
    return json.dumps(data, indent=1)

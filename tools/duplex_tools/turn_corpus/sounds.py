"""Noises made at run time, seeded (each speaker slot has its own instance of every kind): float32
mono 16 kHz, peak-normalised shapes (``render.py`` sets their level)."""

from __future__ import annotations

import numpy as np

RATE = 16_000


def _t(seconds: float) -> np.ndarray:
    return np.arange(int(seconds * RATE)) / RATE


def _band(noise: np.ndarray, low: float, high: float) -> np.ndarray:
    spectrum = np.fft.rfft(noise)
    freqs = np.fft.rfftfreq(len(noise), 1 / RATE)
    spectrum[(freqs < low) | (freqs > high)] = 0
    return np.fft.irfft(spectrum, len(noise))


def _burst(rng: np.random.Generator, seconds: float, low: float, high: float, attack: float,
           decay: float) -> np.ndarray:
    t = _t(seconds)
    return _band(rng.normal(0, 1, len(t)), low, high) * np.minimum(1, t / attack) * np.exp(-t / decay)


def _place(length_s: float, parts: list[tuple[float, np.ndarray]]) -> np.ndarray:
    out = np.zeros(int(length_s * RATE))
    for at, part in parts:
        start = int(at * RATE)
        end = min(len(out), start + len(part))
        out[start:end] += part[:end - start]
    return out


def noise(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u = rng.uniform
    if kind == "cough":  # one or two chesty bursts with a voiced rasp
        n = int(rng.integers(1, 3))
        parts = []
        for i in range(n):
            d = u(0.18, 0.35)
            t = _t(d)
            rasp = np.sin(2 * np.pi * u(120, 220) * t) * (0.3 + 0.3 * rng.normal(0, 1, len(t)))
            parts.append((i * u(0.3, 0.45), _burst(rng, d, 200, 2500, 0.01, d / 3) + 0.3 * rasp * np.exp(-t / (d / 3))))
        audio = _place(n * 0.5, parts)
    elif kind == "sneeze":  # an in-breath, then a sharp broadband burst
        inhale = _band(rng.normal(0, 1, int(0.35 * RATE)), 500, 4000) * np.linspace(0, 0.3, int(0.35 * RATE))
        audio = np.concatenate([inhale, _burst(rng, u(0.2, 0.35), 300, 7000, 0.005, 0.08)])
    elif kind == "knock":  # 2-4 knocks: damped low resonances
        n = int(rng.integers(2, 5))
        gap = u(0.12, 0.22)
        f = u(150, 400)
        t = _t(0.1)
        knock = np.sin(2 * np.pi * f * t) * np.exp(-t / 0.015) + 0.3 * _burst(rng, 0.1, 500, 3000, 0.001, 0.005)
        audio = _place(n * gap + 0.1, [(i * gap, knock) for i in range(n)])
    elif kind == "door slam":
        t = _t(0.6)
        audio = _burst(rng, 0.6, 40, 1500, 0.002, 0.08) + 0.5 * np.sin(2 * np.pi * u(60, 110) * t) * np.exp(-t / 0.12)
    elif kind == "clicks":  # a pen or a mouse: sharp ticks
        n = int(rng.integers(3, 8))
        audio = _place(0.1 + n * 0.12, [(i * u(0.06, 0.15), _burst(rng, 0.01, 1500, 7000, 0.0005, 0.002))
                                        for i in range(n)])
    elif kind == "keyboard":
        n = int(rng.integers(8, 16))
        at = np.cumsum(rng.uniform(0.06, 0.18, n))
        audio = _place(float(at[-1]) + 0.1, [(float(a), _burst(rng, 0.03, 800, 6000, 0.001, 0.006)) for a in at])
    elif kind == "breath":  # a long out-breath: soft band noise, slow envelope
        d = u(0.5, 0.9)
        audio = _band(rng.normal(0, 1, int(d * RATE)), 300, 3000) * np.sin(np.pi * _t(d) / d) ** 2
    elif kind == "laughter":  # "ha ha ha": voiced bursts on a breathy carrier
        n = int(rng.integers(3, 6))
        f0 = u(150, 280)
        t = _t(0.12)
        syllable = ((np.sign(np.sin(2 * np.pi * f0 * t)) * 0.4 + _band(rng.normal(0, 1, len(t)), 300, 3000))
                    * np.sin(np.pi * t / 0.12))
        audio = _place(n * 0.2 + 0.1, [(i * u(0.17, 0.22), syllable) for i in range(n)])
    elif kind == "music/tv":  # a short chord with a beat, or a burst of band-limited chatter
        d = u(0.6, 1.0)
        t = _t(d)
        chord = sum(np.sin(2 * np.pi * f * t) for f in rng.choice([220, 277, 330, 392, 440, 523], 3, replace=False))
        beat = (np.sin(2 * np.pi * 2.5 * t) > 0.6) * _band(rng.normal(0, 1, len(t)), 60, 300)
        chatter = 0.3 * _band(rng.normal(0, 1, len(t)), 300, 3000) * np.abs(np.sin(2 * np.pi * 4 * t))
        audio = chord * 0.5 + beat + chatter
    else:
        raise ValueError(f"unknown noise kind {kind!r}")
    audio = np.asarray(audio, np.float64)
    return (audio / (np.max(np.abs(audio)) or 1.0)).astype(np.float32)

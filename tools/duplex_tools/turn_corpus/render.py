"""A clip's audio as the session hears it: the speaker's speech (or a noise) at a seeded level,
after a lead of room tone and before a tail long enough for every decision, under its condition
(``clean``; background noise at 20 or 10 dB SNR; a room's reverb; the phone line: 8 kHz and a
G.711 mu-law round trip). int16 mono 16 kHz, cached (``cache/clips``)."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from duplex.audio import resample
from duplex.edge.media import g711
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.sounds import noise
from duplex_tools.turn_corpus.synth import RATE, _sox, speech

LEAD_S = 0.6
TAIL_S = 2.4  # past the longest pause a semantic turn waits (2 s)


@dataclass(frozen=True)
class Rendered:
    audio: np.ndarray  # int16, 16 kHz
    start: int  # sample where the clip's sound begins
    pause_at: int | None  # pause clips: the sample where the pause begins (else None)
    end: int  # sample where the clip's sound ends


def seed_of(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def _source(cache: Path, clip: spec.Clip) -> tuple[np.ndarray, int | None]:
    speaker = clip.speaker
    if clip.category == "noise":
        return noise(clip.variant, seed_of(speaker.name, clip.variant)) * 0.5, None
    if clip.category == "pause":
        before, after = spec.PAUSES[clip.variant]
        audio, cut = speech(cache, speaker, before, spec.PAUSE_S, after)
        return audio, cut
    text = {"backchannel": spec.BACKCHANNELS, "interruption": spec.INTERRUPTIONS, "smooth": spec.SMOOTH}[
        clip.category][clip.variant]
    return speech(cache, speaker, text)[0], None


def active_rms(audio: np.ndarray) -> float:
    frame = RATE // 50
    frames = max(1, len(audio) // frame)
    rms = np.sqrt(np.mean(audio[:frames * frame].reshape(frames, -1) ** 2, axis=1)) if len(audio) >= frame else \
        np.array([np.sqrt(np.mean(audio**2))])
    loud = rms[rms > 0.1 * rms.max()] if rms.max() > 0 else rms
    return float(np.sqrt(np.mean(loud**2))) or 1e-4


def room_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Room noise: pink noise with a mains hum and a faint murmur of band-limited chatter."""
    white = rng.normal(0, 1, n)
    spectrum = np.fft.rfft(white)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[1:] /= np.sqrt(freqs[1:])
    spectrum[0] = 0
    pink = np.fft.irfft(spectrum, n)
    t = np.arange(n) / RATE
    hum = 0.2 * np.sin(2 * np.pi * 50 * t) * pink.std()
    return pink + hum


def render(cache: Path, clip: spec.Clip) -> Rendered:
    key = hashlib.sha1(f"r5|{clip.key}".encode()).hexdigest()[:20]
    path = cache / "clips" / f"{key}.npz"
    if path.is_file():
        data = np.load(path)
        pause = int(data["marks"][2])
        return Rendered(data["audio"], int(data["marks"][0]), pause if pause >= 0 else None, int(data["marks"][1]))
    rendered = _render(cache, clip)
    path.parent.mkdir(parents=True, exist_ok=True)
    marks = np.array([rendered.start, rendered.end, -1 if rendered.pause_at is None else rendered.pause_at])
    np.savez(path, audio=rendered.audio, marks=marks)
    return rendered


def _render(cache: Path, clip: spec.Clip) -> Rendered:
    rng = np.random.default_rng(seed_of(clip.key))
    source, pause_at = _source(cache, clip)
    # the caller's level (near and far, loud and soft): the speaker's, the same under every condition
    level_db = np.random.default_rng(seed_of(clip.speaker.name, clip.category, clip.variant)).uniform(-30, -18)
    source = source * (10 ** (level_db / 20) / active_rms(source))
    lead, tail = int(LEAD_S * RATE), int(TAIL_S * RATE)
    stream = np.concatenate([np.zeros(lead), source, np.zeros(tail)])
    reference_rms = 10 ** (-24 / 20) if clip.category == "noise" else active_rms(source)
    condition = clip.condition
    if condition in ("snr20", "snr10"):
        snr = 20 if condition == "snr20" else 10
        background = room_noise(rng, len(stream))
        stream = stream + background * (reference_rms / 10 ** (snr / 20) / background.std())
    elif condition == "room":
        reverberance, room = int(rng.integers(30, 80)), int(rng.integers(40, 100))
        wet = _sox(stream.astype(np.float32), ["reverb", str(reverberance), "50", str(room)])
        stream = wet[:len(stream)] if len(wet) >= len(stream) else np.pad(wet, (0, len(stream) - len(wet)))
        stream = stream + room_noise(rng, len(stream)) * (reference_rms / 10 ** 3)  # a quiet room's hiss
    elif condition == "phone":
        line = resample(stream.astype(np.float32), RATE, 8000)
        line = line + room_noise(rng, len(line))[: len(line)] * (reference_rms / 10 ** 2)  # the line's hiss at 40 dB
        pcm = g711.float_to_int16(line)
        stream = resample(g711.decode(g711.encode(pcm, "PCMU"), "PCMU").astype(np.float32) / 32768.0, 8000, RATE)
        stream = stream[: lead + len(source) + tail]
    elif condition != "clean":
        raise ValueError(f"unknown condition {condition!r}: one of {', '.join(spec.CONDITIONS)}")
    audio = g711.float_to_int16(np.asarray(stream, np.float32))
    return Rendered(audio, lead, None if pause_at is None else lead + pause_at, lead + len(source))

"""The caller's audio for each step, made at run time: espeak-ng (or Piper) speech, WAV files, noise
bursts (white, or a cough-like burst), silence. All float32 mono at 48 kHz."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from duplex.audio import resample
from duplex_tools.client import FRAME, ONSET_RMS, RATE
from duplex_tools.harness import espeak, read_wav
from duplex_tools.scenario.model import PIPER, Scenario, Step

NOISE_RMS = 0.3


@lru_cache(maxsize=128)
def _speech(text: str, voice: str, words_per_minute: int) -> np.ndarray:
    if voice == PIPER:
        return _piper(text)
    return espeak(text, rate=RATE, voice=voice, words_per_minute=words_per_minute)


def _piper(text: str) -> np.ndarray:
    """Piper without its noise: the same samples every run (its prosody is nearer a person's,
    which an end-of-turn model listening to the sound needs)."""
    from duplex.models.local.assets import piper_voice_paths
    from duplex.models.local.tts import PiperSynth

    synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
    return resample(synth.synthesize(text), synth.sample_rate, RATE).astype(np.float32)


@lru_cache(maxsize=32)
def _piper_words(text: str) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """Piper's reading of ``text`` (as ``_piper``), its sample rate, and the sample where each
    word but the last ends (from the voice's phoneme alignments: a word ends at a space or a
    sentence's end)."""
    from piper import PiperVoice, SynthesisConfig

    from duplex.models.local.assets import piper_voice_paths

    voice = PiperVoice.load(*piper_voice_paths(), include_alignments=True)
    chunks = list(voice.synthesize(text, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, volume=0.8),
                                   include_alignments=True))
    ends: list[int] = []
    at = 0
    for chunk in chunks:
        for aligned in chunk.phoneme_alignments or []:
            if aligned.phoneme == " ":
                ends.append(at)
            at += aligned.num_samples
        ends.append(at)
    if len(ends) != len(text.split()):
        phonemes = " | ".join("".join(a.phoneme for a in c.phoneme_alignments or []) for c in chunks)
        raise ValueError(f"the voice read {len(ends)} words in {text!r} ({phonemes}), not {len(text.split())}: "
                         "it joined or split words there; rephrase the sentence")
    audio = np.concatenate([chunk.audio_float_array for chunk in chunks])
    return audio, voice.config.sample_rate, tuple(ends[:-1])


def _sentence_part(parts: tuple[str, ...], index: int) -> np.ndarray:
    """Part ``index`` of the sentence ``parts`` read as one (cut where its words end)."""
    audio, rate, ends = _piper_words(" ".join(parts))
    words = np.cumsum([len(part.split()) for part in parts])
    cuts = [0, *(ends[count - 1] for count in words[:-1]), len(audio)]
    return resample(audio[cuts[index]:cuts[index + 1]], rate, RATE).astype(np.float32)


def _sentence_of(scenario: Scenario, step: Step) -> tuple[tuple[str, ...], int]:
    """The say steps read as one sentence with ``step`` (``goes_on`` joins a step to the next
    say step), and ``step``'s place among them."""
    says = [s for s in scenario.steps if s.say is not None]
    at = next(i for i, s in enumerate(says) if s is step)
    first = at
    while first > 0 and says[first - 1].goes_on:
        first -= 1
    last = at
    while says[last].goes_on:
        last += 1
    return tuple(str(s.say) for s in says[first:last + 1]), at - first


def step_audio(scenario: Scenario, step: Step, seed: int = 0) -> np.ndarray:
    parts, index = _sentence_of(scenario, step) if step.say is not None else ((), 0)
    if len(parts) > 1:
        samples = _sentence_part(parts, index) * step.level
    elif step.say is not None:
        samples = _speech(step.say, step.voice, step.words_per_minute) * step.level
    elif step.wav is not None:
        data, rate = read_wav(scenario.wav_path(step))
        samples = resample(data, rate, RATE) * step.level
    elif step.noise is not None:
        samples = noise_burst(step.noise, step.noise_kind, step.level, seed)
    else:
        samples = np.zeros(int(round((step.pause or 0.0) * RATE)), np.float32)
    return np.clip(samples, -1.0, 1.0).astype(np.float32)


def noise_burst(seconds: float, kind: str = "white", level: float = 1.0, seed: int = 0) -> np.ndarray:
    """White noise at a steady level, or a cough: noise low-passed to a chesty band under a
    sharp attack and a fast decay."""
    n = max(1, int(round(seconds * RATE)))
    noise = np.random.default_rng(seed).normal(0.0, 1.0, n)
    if kind == "cough":
        spectrum = np.fft.rfft(noise)
        freqs = np.fft.rfftfreq(n, 1 / RATE)
        spectrum *= 1.0 / (1.0 + (freqs / 1200.0) ** 2)
        noise = np.fft.irfft(spectrum, n)
        t = np.arange(n) / RATE
        noise *= np.minimum(1.0, t / 0.008) * np.exp(-t / max(seconds / 3, 1e-3))
    rms = float(np.sqrt(np.mean(noise**2))) or 1.0
    return (noise * (NOISE_RMS * level / rms)).astype(np.float32)


def loud_span(samples: np.ndarray) -> tuple[int, int] | None:
    """First and last 20 ms frame (as the microphone cuts the clip) loud enough to count as
    sound: the first is the one whose sending marks the clip's onset."""
    frames = len(samples) // FRAME + (len(samples) % FRAME > 0)
    padded = np.zeros(frames * FRAME, np.float32)
    padded[: len(samples)] = samples
    rms = np.sqrt(np.mean(padded.reshape(frames, FRAME) ** 2, axis=1))
    loud = np.flatnonzero(rms > ONSET_RMS)
    return (int(loud[0]), int(loud[-1])) if loud.size else None

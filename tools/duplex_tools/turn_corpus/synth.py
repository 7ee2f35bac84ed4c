"""Speakers' speech at 16 kHz, float32 mono, cached on disk (``cache/speech``) by what made it:
espeak-ng (its voice, rate and pitch) or Piper's ``joe`` voice (length and noise scales), then a
sox pitch shift. A sentence with a pause is read as one sentence and the pause put in where its
words part (espeak-ng: an SSML break; Piper: its phoneme alignments), so the words before the
pause keep the sentence's running intonation instead of a sentence's end."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from duplex.audio import resample
from duplex_tools.harness import read_wav, write_wav
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.spec import Speaker

RATE = 16_000
_BREAK_MS = 700  # espeak-ng's SSML break, found again in its output and set to the pause wanted


def _path(cache: Path, key: str) -> Path:
    return cache / "speech" / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.npy"


def _cached(cache: Path, key: str, make: Any) -> np.ndarray:
    path = _path(cache, key)
    if path.is_file():
        return np.load(path)
    audio = np.asarray(make(), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, audio)
    return audio


def speech(cache: Path, speaker: Speaker, text: str, pause_s: float | None = None,
           after: str = "") -> tuple[np.ndarray, int]:
    """``text`` (then, with ``pause_s``, a pause and ``after``: one sentence) in ``speaker``'s voice;
    and the sample where the pause begins (the end of the audio without one)."""
    key = f"v4|{speaker}|{text}|{pause_s}|{after}"
    if speaker.synth == "piper" and not _voice and not _path(cache, key).is_file():
        _piper_speaker(cache, speaker)
    audio = _cached(cache, key, lambda: _make(speaker, text, pause_s, after))
    cut = _cached(cache, key + "|cut", lambda: np.array([_pause_at(audio, pause_s)], np.float32))
    return audio, int(cut[0])


def _make(speaker: Speaker, text: str, pause_s: float | None, after: str) -> np.ndarray:
    if speaker.synth == "espeak":
        audio = _espeak(speaker, text, pause_s, after)
    else:
        audio = _piper(speaker, text, pause_s, after)
    if speaker.shift_cents:
        audio = _sox(audio, ["pitch", str(speaker.shift_cents)])
    return _trim(audio)


def _trim(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0]:loud[-1] + 1] if loud.size else audio


def _pause_at(audio: np.ndarray, pause_s: float | None) -> int:
    """Where the longest quiet run (the pause put in) begins; the end without a pause."""
    if pause_s is None:
        return len(audio)
    frame = RATE // 100
    frames = len(audio) // frame
    quiet = np.sqrt(np.mean(audio[:frames * frame].reshape(frames, frame) ** 2, axis=1)) < 0.003
    best, start, run = (0, 0), 0, 0
    for i, q in enumerate(quiet):
        run = run + 1 if q else 0
        if run == 1:
            start = i
        if run > best[0]:
            best = (run, start)
    return best[1] * frame


def _espeak(speaker: Speaker, text: str, pause_s: float | None, after: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        args = ["espeak-ng", "-v", speaker.voice, "-s", str(speaker.words_per_minute), "-p", str(speaker.pitch),
                "-w", str(path)]
        if pause_s is not None:
            args += ["-m", f'<speak>{text} <break time="{_BREAK_MS}ms"/> {after}</speak>']
        else:
            args.append(text)
        subprocess.run(args, check=True, capture_output=True, timeout=60)
        samples, rate = read_wav(path)
    audio = resample(samples, rate, RATE)
    return _set_pause(_trim(audio), pause_s) if pause_s is not None else audio


def _set_pause(audio: np.ndarray, pause_s: float) -> np.ndarray:
    """The quiet run (the break) replaced by exactly ``pause_s`` of silence."""
    at = _pause_at(audio, pause_s)
    rest = audio[at:]
    loud = np.flatnonzero(np.abs(rest) > 0.01)
    back = at + (int(loud[0]) if loud.size else len(rest))
    return np.concatenate([audio[:at], np.zeros(int(pause_s * RATE), np.float32), audio[back:]])


_voice: list[Any] = []  # the Piper voice of the speaker being made


def _piper_speaker(cache: Path, speaker: Speaker) -> None:
    """Every text of the corpus in ``speaker``'s Piper voice, in one fixed order from a voice
    loaded with the speaker's seed: the voice draws its noise inside the model, from a generator
    seeded when it is loaded, so this is the same every run."""
    import onnxruntime
    from piper import PiperVoice

    from duplex.models.local.assets import piper_voice_paths

    onnxruntime.set_seed(zlib.crc32(speaker.name.encode()) & 0x7FFFFFFF)
    _voice[:] = [PiperVoice.load(*piper_voice_paths(), include_alignments=True)]
    try:
        alone = (*spec.BACKCHANNELS.values(), *spec.INTERRUPTIONS.values(), *spec.SMOOTH.values())
        texts: list[tuple[str, float | None, str]] = [(text, None, "") for text in alone]
        texts += [(before, spec.PAUSE_S, after) for before, after in spec.PAUSES.values()]
        for text, pause_s, after in texts:
            speech(cache, speaker, text, pause_s, after)
    finally:
        _voice.clear()


def _piper(speaker: Speaker, text: str, pause_s: float | None, after: str) -> np.ndarray:
    from piper import SynthesisConfig

    if not _voice:
        raise RuntimeError(f"{text!r} is not a text of the corpus: Piper speech is made for all of them at once")
    voice = _voice[0]
    sentence = f"{text} {after}".strip() if pause_s is not None else text
    config = SynthesisConfig(length_scale=speaker.length_scale, noise_scale=speaker.noise_scale,
                             noise_w_scale=speaker.noise_w_scale, volume=0.8)
    chunks = list(voice.synthesize(sentence, config, include_alignments=True))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    rate = voice.config.sample_rate
    if pause_s is not None:
        ends, at = [], 0
        for chunk in chunks:
            for aligned in chunk.phoneme_alignments or []:
                if aligned.phoneme == " ":
                    ends.append(at)
                at += aligned.num_samples
        cut = ends[len(text.split()) - 1]
        audio = np.concatenate([audio[:cut], np.zeros(int(pause_s * rate), np.float32), audio[cut:]])
    return resample(audio, rate, RATE)


def _sox(audio: np.ndarray, effect: list[str], rate: int = RATE) -> np.ndarray:
    """``audio`` through a sox effect (same rate; no dither, so the same samples every run)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        write_wav(src, np.clip(audio, -1, 1), rate)
        subprocess.run(["sox", "-D", str(src), str(dst), *effect], check=True, capture_output=True, timeout=60)
        out, _ = read_wav(dst)
    return out.astype(np.float32)

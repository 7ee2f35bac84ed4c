"""The models the session's decisions hear with, run here as the server runs them, their answers
cached on disk by the audio's hash (``cache/heard.json``, ``cache/smart_turn.json``), so a rerun
costs nothing: Whisper-base through the local ASR's own ``WhisperTranscriber`` with the streaming
policy's window and the ``local`` pipeline's hint (its domain words: over a noise they turn
Whisper's made-up syllables into sentences, so words heard without it read noises too kindly),
and Smart Turn."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from duplex.models.local.asr import Heard, StreamingPolicy, window_frames

RATE = 16_000


class _Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        self.dirty = 0

    def save(self) -> None:
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)
            self.dirty = 0


def _hash_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _local_hint() -> str:
    """The ``local`` pipeline's ASR hint, as its config gives it."""
    from duplex.config import load_pipeline

    stage = next(stage for stage in load_pipeline("local", []).stages if stage.name == "asr")
    return str(stage.args.get("hint", ""))


def _hash(audio: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(audio, np.int16).tobytes()).hexdigest()[:24]


class Ears:
    def __init__(self, cache: Path, threads: int = 2, hint: str | None = None) -> None:
        self._asr_store = _Store(cache / "heard.json")
        self._turn_store = _Store(cache / "smart_turn.json")
        self._threads = threads
        self._whisper: Any = None
        self._smart: Any = None
        self.policy = StreamingPolicy()
        self.hint = _local_hint() if hint is None else hint

    def words(self, audio: np.ndarray) -> str:
        """What the pipeline's ASR writes for int16 ``audio`` (a final transcript)."""
        return self.hear(audio).text

    def hear(self, audio: np.ndarray) -> Heard:
        """``words`` with Whisper's confidence in them."""
        key = _hash(audio) + (f"+{_hash_text(self.hint)}" if self.hint else "")
        if key not in self._asr_store.data:
            if self._whisper is None:
                from duplex.models.local.asr import WhisperTranscriber
                from duplex.models.local.assets import prepare_whisper

                self._whisper = WhisperTranscriber(prepare_whisper(), threads=self._threads, hint=self.hint)
            clip = audio.astype(np.float32) / 32768.0
            (heard,) = self._whisper.hear([clip], window_frames(len(clip) / RATE, self.policy))
            self._asr_store.data[key] = [heard.text, heard.no_speech_prob, heard.avg_logprob]
            self._asr_store.dirty += 1
            if self._asr_store.dirty >= 50:
                self._asr_store.save()
        text, no_speech_prob, avg_logprob = self._asr_store.data[key]
        return Heard(str(text), float(no_speech_prob), float(avg_logprob))

    def complete_probability(self, audio: np.ndarray) -> float:
        """Smart Turn's P(turn complete) for int16 ``audio`` (the turn so far)."""
        key = _hash(audio)
        if key not in self._turn_store.data:
            if self._smart is None:
                from duplex.models.smart_turn.model import SmartTurn

                self._smart = SmartTurn()
            self._turn_store.data[key] = self._smart.predict(audio.astype(np.float32) / 32768.0)
            self._turn_store.dirty += 1
            if self._turn_store.dirty >= 50:
                self._turn_store.save()
        return float(self._turn_store.data[key])

    def save(self) -> None:
        self._asr_store.save()
        self._turn_store.save()

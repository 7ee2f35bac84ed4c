"""Streaming speech recognition: Whisper-base (CTranslate2, int8) on the audio heard so far.

Whisper is not a streaming model, so streaming is a policy on top of it:

- while the user speaks, the whole utterance so far is re-transcribed after every
  ``partial_interval_s`` of new speech, and as soon as ``settle_s`` of silence follows speech
  (the likely end of the turn, before the session's VAD has decided it; not in a crowd, below);
- at end of speech (the request's last audio chunk), if nothing but silence arrived since the
  last partial, that partial IS the final transcript and no model call is left to wait for;
- with more than ``partial_speakers`` callers speaking at once, each one's partials come less
  often (the interval grows with the crowd) and a settled pause makes none: under load the
  cores go to the finals first.

"Speech" here is the session's own voice-activity decision, which each ``CallerAudio`` chunk
carries per frame: one decision per frame, the same one the session ended the turn on.

Whisper pads every input to 30 s and the encoder's cost follows the padded length. The encoder
window here is fitted to the utterance: its length plus ``window_margin_s``, rounded up to
``window_step_s`` (min ``min_window_s``), so a 2 s turn pays for a 3-4 s window, not 7 s (measured
on 2 cores: encoder + greedy decode of a 2 s question ~0.3 s at 3 s, ~0.45 s at 7 s, ~2 s at 30 s).
Whisper-base loops on a window much shorter than 7 s ("Wait, stop. Wait, stop. ..."), so windows
under ``loop_guard_below_s`` decode with ``repetition_penalty`` (it ends the line instead of
repeating it; longer windows decode without it: the penalty there changed words of long
utterances), every decode is capped at ``tokens_per_s`` of window, and a transcript that starts
repeating itself is cut after its first copy. Utterances past ``commit_after_s`` are committed
window by window, so one call never sees more than ~30 s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field
from pydantic.dataclasses import dataclass

from duplex.runtime.contract import SESSION_RATE, CallerAudio, Transcript, TurnRequest, WorkItem

SAMPLE_RATE = SESSION_RATE
_HOP = 160  # mel frames are 10 ms


@dataclass(frozen=True)
class StreamingPolicy:
    partial_interval_s: float = 1.0
    settle_s: float = 0.2
    min_window_s: float = Field(default=3.0, gt=0, le=30)
    window_margin_s: float = Field(default=1.0, ge=0)  # room after the utterance (a word cut at the edge is lost)
    window_step_s: float = Field(default=1.0, gt=0)  # windows come in these steps, so batched finals share a shape
    commit_after_s: float = 25.0
    min_speech_s: float = 0.09  # voiced audio that counts as "speech happened"
    # Partials are a luxury (a warm thinker prefill, a live caption); finals are the critical
    # path. With more callers speaking at once than this, each one's partials come that much
    # less often, so the stage's cores go to the finals (and the thinker) first.
    partial_speakers: int = 2
    speaking_window_s: float = 1.0  # a request fed within this long counts as speaking now


@dataclass(frozen=True)
class LoopGuard:
    """How a short window is kept from looping (see the module's doc): per window length, so
    every clip of a batch (one window) decodes as it would alone."""

    below_s: float = Field(default=5.0, ge=0)  # windows shorter than this decode with the repetition penalty
    repetition_penalty: float = Field(default=1.3, ge=1)
    tokens_per_s: float = Field(default=8.0, gt=0)  # decode cap per second of window

    def penalty(self, window_s: float) -> float:
        return self.repetition_penalty if window_s < self.below_s else 1.0

    def max_tokens(self, window_s: float) -> int:
        return max(8, math.ceil(self.tokens_per_s * window_s))


def window_frames(seconds: float, policy: StreamingPolicy) -> int:
    """The encoder window (mel frames) for ``seconds`` of audio: fitted to it (module doc)."""
    step = policy.window_step_s
    window_s = min(30.0, max(policy.min_window_s, math.ceil((seconds + policy.window_margin_s) / step) * step))
    return int(window_s * SAMPLE_RATE / _HOP)


def first_copy(tokens: list[int], min_repeat: int = 3) -> list[int]:
    """``tokens`` up to where they start repeating themselves: the first copy of a span that is
    followed by at least ``min_repeat`` tokens (or the whole span) of itself, repeated to the end.
    Whisper on a short window ends a line by starting it again; a real "yes, yes" reads as one
    "yes," (a rare loss, against a turn that would be the same words many times over)."""
    n = len(tokens)
    for start in range(n):
        for period in range(2, n - start):
            tail = n - start - period  # tokens after the first copy
            if tail < min(period, min_repeat):
                break
            if tokens[start + period] == tokens[start] and all(
                    tokens[j] == tokens[j - period] for j in range(start + period + 1, n)):
                return tokens[: start + period]
    return tokens


@dataclass(frozen=True)
class Heard:
    """One clip's words and how sure Whisper was of them."""

    text: str
    no_speech_prob: float  # P(no speech) at the first step: high over a noise
    avg_logprob: float  # mean log-probability per decoded token: low when the words were guessed


class WhisperTranscriber:
    """Whisper-base through CTranslate2: greedy decoding, English, no timestamps."""

    def __init__(self, model_dir: Path, threads: int = 1, compute_type: str = "int8", language: str = "en",
                 hint: str = "", guard: LoopGuard | None = None) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self._whisper = WhisperModel(str(model_dir), device="cpu", compute_type=compute_type,
                                     cpu_threads=threads, num_workers=1, local_files_only=True)
        tokenizer = Tokenizer(self._whisper.hf_tokenizer, multilingual=self._whisper.model.is_multilingual,
                              task="transcribe", language=language)
        self._tokenizer = tokenizer
        self.guard = guard or LoopGuard()
        # A hint is Whisper's "previous text": domain words it then prefers ("bubble tea", not
        # "bubble T"; measured on Piper speech with the short encoder window).
        previous = [tokenizer.sot_prev] + tokenizer.encode(" " + hint.strip()) if hint.strip() else []
        self._prompt = previous + list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]

    def transcribe(self, clips: list[np.ndarray], window_frames: int) -> list[str]:
        """One batched encoder + greedy decoder call for clips that share a window length."""
        return [heard.text for heard in self.hear(clips, window_frames)]

    def hear(self, clips: list[np.ndarray], window_frames: int) -> list[Heard]:
        """``transcribe``, with Whisper's confidence in each clip's words."""
        import ctranslate2

        mels = [self._whisper.feature_extractor(clip)[:, :window_frames] for clip in clips]
        features = np.zeros((len(clips), mels[0].shape[0], window_frames), dtype=np.float32)
        for row, mel in enumerate(mels):
            features[row, :, : mel.shape[1]] = mel
        encoded = self._whisper.model.encode(ctranslate2.StorageView.from_array(features))
        window_s = window_frames * _HOP / SAMPLE_RATE
        # max_length counts the prompt too: the cap is on the words
        max_length = min(448, len(self._prompt) + self.guard.max_tokens(window_s))
        results = self._whisper.model.generate(encoded, [self._prompt] * len(clips), beam_size=1,
                                               max_length=max_length, return_no_speech_prob=True,
                                               return_scores=True, repetition_penalty=self.guard.penalty(window_s))
        heard = []
        for result in results:
            tokens = first_copy([t for t in result.sequences_ids[0] if t < self._tokenizer.eot])
            text = self._tokenizer.decode(tokens).strip()
            text = "" if result.no_speech_prob > 0.8 and len(text) < 24 else text
            heard.append(Heard(text, float(result.no_speech_prob), float(result.scores[0])))
        return heard


def _transcript(state: dict, final: bool) -> Transcript:
    """The request's words so far, with Whisper's confidence in their last window."""
    heard: Heard | None = state.get("heard")
    if heard is None:
        return Transcript(state.get("text", ""), final=final)
    return Transcript(state.get("text", ""), final=final, avg_logprob=heard.avg_logprob,
                      no_speech_prob=heard.no_speech_prob)


def typed_text(item: WorkItem) -> str | None:
    """The caller's typed words, when the request is a typed turn (``TurnRequest.text``)."""
    request = item.params
    return request.text if isinstance(request, TurnRequest) and request.text is not None else None


class StreamingASR:
    """The encoder stage's computation (``simple`` scheduler): audio chunks in, transcripts out.

    Takes ``CallerAudio``; emits ``Transcript(final=False)`` for partials and, on the request's
    last chunk, the final ``Transcript(final=True)`` as its eos output.
    """

    def __init__(self, transcriber: WhisperTranscriber, policy: StreamingPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.transcriber = transcriber
        self.policy = policy or StreamingPolicy()
        self.calls = 0  # model calls made (benchmarks and tests read it)
        self._clock = clock
        self._speaking: dict[int, float] = {}  # id(request state) -> when it was last fed

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        due: list[tuple[int, dict]] = []
        outputs: list[list[Any]] = [[] for _ in items]
        interval_s = self._partial_interval(states, [item.eos for item in items])
        for row, (item, state) in enumerate(zip(items, states)):
            typed = typed_text(item)
            if typed is not None:  # a typed turn: its text is the transcript, nothing to recognise
                state["text"] = typed
                continue
            self._append(state, item.data)
            if self._needs_call(state, final=item.eos, interval_s=interval_s):
                due.append((row, state))
        self._transcribe_due(due)
        for row, (item, state) in enumerate(zip(items, states)):
            text = state.get("text", "")
            if typed_text(item) is not None:
                outputs[row] = [Transcript(text, final=True)] if item.eos else []
            elif item.eos:
                outputs[row].append(_transcript(state, final=True))
            elif any(r == row for r, _ in due) and text and text != state.get("sent"):
                state["sent"] = text
                outputs[row].append(_transcript(state, final=False))
        return outputs

    # -- per-request bookkeeping ----------------------------------------------------------------
    def _append(self, state: dict, data: Any) -> None:
        state.setdefault("audio", np.zeros(0, np.float32))
        state.setdefault("done", 0)  # samples covered by state["text"]
        state.setdefault("committed", 0)  # samples whose words are frozen in state["prefix"]
        state.setdefault("voiced", [])  # the session's verdict per frame, over the whole audio
        if data is None:
            return
        if not isinstance(data, CallerAudio):
            raise TypeError(f"asr input needs CallerAudio, got {type(data).__name__}")
        state.setdefault("frame", SAMPLE_RATE * data.frame_ms // 1000)  # samples per verdict
        state["audio"] = np.concatenate([state["audio"], np.asarray(data.samples, np.float32).reshape(-1)])
        state["voiced"].extend(data.voiced)

    def _partial_interval(self, states: list[dict], ends: list[bool]) -> float:
        """The partial interval now: the policy's, stretched by how many callers speak at once."""
        now = self._clock()
        for state, eos in zip(states, ends):
            if eos:
                self._speaking.pop(id(state), None)
            else:
                self._speaking[id(state)] = now
        horizon = now - self.policy.speaking_window_s
        self._speaking = {key: seen for key, seen in self._speaking.items() if seen >= horizon}
        crowd = len(self._speaking) / max(1, self.policy.partial_speakers)
        return self.policy.partial_interval_s * max(1.0, crowd)

    def _needs_call(self, state: dict, final: bool, interval_s: float) -> bool:
        policy = self.policy
        frame = state.get("frame", SAMPLE_RATE)
        new_voiced = state["voiced"][state["done"] // frame:]
        crowded = interval_s > policy.partial_interval_s
        if final or (not crowded and self._settled(new_voiced, frame)):
            # Any voiced frame since the last transcript may be the end of the last word: once
            # silence settles, transcribing now leaves the end of the turn nothing to wait for.
            # In a crowd the cores go to finals: a settled pause waits for its end of turn.
            return any(new_voiced)
        if sum(new_voiced) * frame < policy.min_speech_s * SAMPLE_RATE:
            return False  # nothing new was said (Whisper makes words up from silence: "I")
        new_seconds = (len(state["audio"]) - state["done"]) / SAMPLE_RATE
        return new_seconds >= interval_s

    def _settled(self, new_voiced: list[bool], frame: int) -> bool:
        settle_frames = math.ceil(self.policy.settle_s * SAMPLE_RATE / frame)
        return len(new_voiced) >= settle_frames and not any(new_voiced[-settle_frames:])

    def _transcribe_due(self, due: list[tuple[int, dict]]) -> None:
        groups: dict[int, list[dict]] = {}
        for _, state in due:
            groups.setdefault(self._window_frames(state), []).append(state)
        for window, states in groups.items():
            clips = [state["audio"][state["committed"]:] for state in states]
            heard = self.transcriber.hear(clips, window)
            self.calls += 1
            for state, one in zip(states, heard):
                self._record(state, one)

    def _window_frames(self, state: dict) -> int:
        return window_frames((len(state["audio"]) - state["committed"]) / SAMPLE_RATE, self.policy)

    def _record(self, state: dict, heard: Heard) -> None:
        prefix = state.get("prefix", "")
        state["text"] = f"{prefix} {heard.text}".strip()
        state["heard"] = heard
        state["done"] = len(state["audio"])
        if (state["done"] - state["committed"]) / SAMPLE_RATE >= self.policy.commit_after_s:
            state["prefix"], state["committed"] = state["text"], state["done"]

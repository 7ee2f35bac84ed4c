"""toy_voice: a small real voice pipeline for edge and session tests (no weights).

    ears  (simple)  user audio chunks -> a measured "transcript" of the utterance   (terminal)
      | next
    mind  (simple)  transcript -> reply text, one word per emit
      | stream_to
    voice (simple)  each word -> voiced syllables (synth.py), paced near real time   (terminal)

The voice stage spends ``pace`` seconds of compute per second of audio it makes (a sleep stands
in for a vocoder's work), so a response is still being produced while it plays and a barge-in
aborts work in flight, as it would with a real talker.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from duplex.models.toy_voice.synth import SAMPLE_RATE, speak
from duplex.runtime.contract import (
    SESSION_RATE,
    AgentAudio,
    AgentText,
    BuildContext,
    CallerAudio,
    Transcript,
    TurnRequest,
    WorkItem,
)

DEFAULT_REPLY = (
    "I heard {seconds} seconds of speech with about {syllables} syllables. "
    "This is the toy voice, talking long enough to be interrupted."
)
TYPED_REPLY = "You wrote: {text} This is the toy voice, answering what you typed."
_ENVELOPE_MS = 10


class Ears:
    """Measures the utterance: duration, voiced share and a syllable estimate from the
    energy envelope's peaks. Stands in for speech recognition."""

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [self._one(item, state) for item, state in zip(items, states)]

    def _one(self, item: WorkItem, state: dict) -> list[Any]:
        typed = _request(item).text
        if typed is not None:  # a typed turn: the text is the transcript
            return [Transcript(typed, final=True)] if item.eos else []
        audio = item.data.samples if isinstance(item.data, CallerAudio) else np.zeros(0, np.float32)
        rate = SESSION_RATE
        hop = max(1, rate * _ENVELOPE_MS // 1000)
        usable = len(audio) - len(audio) % hop
        envelope = np.sqrt(np.mean(audio[:usable].reshape(-1, hop) ** 2, axis=1)) if usable else np.zeros(0)
        state.setdefault("envelope", []).extend(envelope.tolist())
        state["seconds"] = state.get("seconds", 0.0) + len(audio) / rate
        if not item.eos:
            return []
        return [Transcript(self._describe(state), final=True)]

    @staticmethod
    def _describe(state: dict) -> str:
        envelope = np.asarray(state.get("envelope", []))
        seconds = state.get("seconds", 0.0)
        if envelope.size == 0 or envelope.max() <= 1e-4:
            return "(silence)"
        smooth = np.convolve(envelope, np.ones(5) / 5, mode="same")
        loud = smooth > 0.3 * smooth.max()
        syllables = int(np.sum(loud[1:] & ~loud[:-1]) + loud[0])
        return f"[{seconds:.1f} s of speech, about {syllables} syllables]"


class Mind:
    """Writes the reply: a template filled from the ears' measurement, one word per emit."""

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [self._one(item) for item in items]

    def _one(self, item: WorkItem) -> list[Any]:
        heard = item.data.text if isinstance(item.data, Transcript) else ""
        if _request(item).text is not None:
            if not item.eos:
                return []
            return [AgentText(word) for word in TYPED_REPLY.format(text=heard.strip()).split()]
        numbers = [token for token in heard.replace("[", " ").split() if _is_number(token)]
        seconds, syllables = (numbers + ["no", "no"])[:2]
        words = self.reply.format(seconds=seconds, syllables=syllables).split()
        if not item.eos:
            return []
        return [AgentText(word) for word in words]


class Voice:
    """Turns each word into voiced syllables; emits per word its text delta, then its audio
    (which says the word it voices)."""

    def __init__(self, pace: float) -> None:
        self.pace = pace

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        outputs: list[list[Any]] = []
        seconds = 0.0
        for item, state in zip(items, states):
            word = item.data.text if isinstance(item.data, AgentText) else ""
            if not word:
                outputs.append([])
                continue
            index = state["words"] = state.get("words", -1) + 1
            if not _request(item).output_audio:  # a text-only reply: the words, no voice
                outputs.append([AgentText(word if index == 0 else " " + word)])
                continue
            audio = speak(word, index)
            seconds = max(seconds, len(audio) / SAMPLE_RATE)
            text = word if index == 0 else " " + word
            outputs.append([AgentText(text), AgentAudio(audio, SAMPLE_RATE, text)])
        time.sleep(self.pace * seconds)  # the batch's rows are made together, like a vocoder step
        return outputs


def _request(item: WorkItem) -> TurnRequest:
    return item.params if isinstance(item.params, TurnRequest) else _NO_REQUEST


_NO_REQUEST = TurnRequest(session_id="")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def build_ears(ctx: BuildContext) -> Ears:
    return Ears()


def build_mind(ctx: BuildContext) -> Mind:
    return Mind(str(ctx.args.get("reply", DEFAULT_REPLY)))


def build_voice(ctx: BuildContext) -> Voice:
    return Voice(float(ctx.args.get("pace", 0.3)))


BUILDERS = {
    "toy_voice.ears": build_ears,
    "toy_voice.mind": build_mind,
    "toy_voice.voice": build_voice,
}

"""Semantic end of turn (``turn_detection: semantic_vad``): is a pause the end of the caller's
turn? At a pause of ``semantic.check_ms`` the judge asks the server's ``TurnEndModel`` (Smart
Turn: the sound of the turn's last seconds) and looks at the turn's last words (from the ASR's
transcripts); the turn is complete when the model's probability reaches the eagerness'
threshold and the words do not hang ("I'd like a large, um", or trailing off in "..."); where
the pipeline's ASR writes sentences (``unclosed_at``), a transcript left open needs a surer
model. A question the ASR heard asked (its transcript ends in "?") is complete too, whatever
the model says: Smart Turn hears Piper's "Sorry, can I ask something else instead" as unfinished
(0.02), Whisper writes it with a "?", and puts one on none of the truncated lines measured. A
complete turn ends at once; one that is not waits, up to the longest pause
(``TurnDetector.silence_ms``).

With ``semantic.judge: learned`` the same probability and words are read by the learned model
(``turn_model``: trained on many synthetic voices) instead of the threshold and word lists.

The model runs off the event loop (it is awaited in a session task) and its verdict arrives a
few frames later; it counts only if the pause it was asked about still goes on then.

The words must be those of the pause judged: an interim transcript lags the voice by up to a
partial interval and often ends mid-sentence ("... a large taro milk tea with"), so where the
pipeline transcribes (an interim came) the verdict waits for the speculation's final transcript,
which covers the turn up to the pause. That costs the answer nothing: it needs that transcript too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from duplex.config.session import SemanticTurnConfig
from duplex.session.turn_model import read_pause
from duplex.session.words import HANGING_WORDS, NEVER_LAST, asks, closes


class TurnEndModel(Protocol):
    """P(turn complete) from the turn's audio (float32 16 kHz mono, the last seconds count)."""

    def prepare(self) -> None: ...  # a session will judge turns: get ready (returns at once)
    async def complete_probability(self, audio: np.ndarray) -> float: ...


_WORD = re.compile(r"[a-z']+")


def words_hang(text: str) -> bool:
    """The transcript stops where a sentence goes on: on a hanging word (of a question, only on
    one no sentence ends on), or trailing off (the ASR writes "..." where the voice stops
    mid-sentence: Whisper on Piper's "I would like to order a large" cut from the whole sentence,
    "." where it was read alone)."""
    words = _WORD.findall(text.lower())
    trails_off = text.rstrip(" \"')").endswith(("...", "\u2026"))
    hanging = NEVER_LAST if asks(text) else HANGING_WORDS
    return bool(words) and (words[-1] in hanging or trails_off)


@dataclass(frozen=True)
class TurnJudgement:
    pause_end_ms: int  # the end of speech of the pause judged
    probability: float | None  # the model's P(complete); None: no model on this server
    words_hang: bool  # the turn's last words say it is not over
    complete: bool
    words_ask: bool = False  # the turn's words end a question: complete, whatever the model says
    words_open: bool = False  # the transcript ends with no sentence's close: the model must be surer


class EndOfTurnJudge:
    def __init__(self, config: SemanticTurnConfig, model: TurnEndModel | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 settle: Callable[[TurnJudgement], None]) -> None:
        self.config = config
        self.model = model
        self._spawn = spawn
        self._settle = settle  # called once per judged pause, on the event loop
        self._words = ""  # the turn's latest transcript
        self._transcribed = False  # a transcript of the turn came: its pipeline transcribes
        self._final = False  # the latest transcript covers the turn up to the pause (the speculation's final)
        self._asked: int | None = None  # the pause being judged
        self._waiting: tuple[int, float | None] | None = None  # a verdict waiting for the final words

    def reconfigure(self, config: SemanticTurnConfig, judging: bool) -> None:
        """``judging``: the session's turns are semantic from now on."""
        self.config = config
        if judging and self.model is not None:
            self.model.prepare()

    def heard(self, text: str, final: bool = True) -> None:
        """The ASR's latest transcript of the turn (interim, or the final one of the speculation)."""
        if text:
            self._words = text
        self._transcribed = True
        self._final = final
        if final and self._waiting is not None:
            pause_end_ms, probability = self._waiting
            self._decide(pause_end_ms, probability)

    def judge(self, pause_end_ms: int, audio: np.ndarray) -> None:
        """A pause of ``check_ms`` in the turn: judge it (now, or when the model answers)."""
        self._asked = pause_end_ms
        if self.model is None:
            self._verdict(pause_end_ms, None)
            return
        self._spawn(self._ask(pause_end_ms, audio))

    def forget(self) -> None:
        """The turn ended or the caller spoke again: no verdict pending counts any more (and the
        words so far no longer reach the end of the turn)."""
        self._asked = self._waiting = None
        self._final = False

    def new_turn(self) -> None:
        self.forget()
        self._words, self._transcribed = "", False

    async def _ask(self, pause_end_ms: int, audio: np.ndarray) -> None:
        assert self.model is not None
        probability = await self.model.complete_probability(audio)
        if self._asked == pause_end_ms:
            self._verdict(pause_end_ms, probability)

    def _verdict(self, pause_end_ms: int, probability: float | None) -> None:
        """The sound is judged: decide now, or once the words of the pause are in."""
        if self._transcribed and not self._final:
            self._waiting = (pause_end_ms, probability)
            return
        self._decide(pause_end_ms, probability)

    def _decide(self, pause_end_ms: int, probability: float | None) -> None:
        hangs, question = words_hang(self._words), asks(self._words)
        config = self.config
        words_open = config.unclosed_at is not None and bool(self._words) and not closes(self._words)
        complete_at = max(config.complete_at, config.unclosed_at or 0.0) if words_open else config.complete_at
        sounds_complete = probability is None or probability >= complete_at
        complete = (sounds_complete or question) and not hangs
        learned = read_pause(probability, self._words) if config.judge == "learned" and probability is not None \
            else None
        if learned is not None:  # the learned reading of the same sound and words
            complete = learned
        self._asked = self._waiting = None
        self._settle(TurnJudgement(pause_end_ms, probability, hangs, complete, question, words_open))

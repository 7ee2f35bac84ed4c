"""The session's turn-taking decisions on one clip, in process and on stream time (no server, no
wall clock): the clip's 20 ms frames go through the session's VAD (``FrameClassifier``), its turn
detector, and

- for an overlap (a backchannel, noise or interruption while the agent talks): the listening
  barge-in's judge (``overlap.Listening`` with ``OverlapJudge``) from the onset the detector
  reports (at ``barge_in.pause_speech_ms``), its words from Whisper-base on the audio the session's
  probe would send (from the onset's prefix to ``words_final_ms`` after the sound), arriving
  ``asr_ms`` later; a sound after a verdict that resumed is judged again (and continues the last);
- for a turn with a pause (or a complete one): the silence rule (``vad.silence_ms``) and the
  semantic rule (``endpoint.EndOfTurnJudge`` with Smart Turn and the turn's words at ``check_ms``).

``hearing`` (optional) replaces the words' reading (``Listening.says``), ``sound`` the reading of
the sound at ``interrupt_ms`` (``barge_in.sound: learned``; without it nothing is held, and the
sounds it was asked on are kept: the sound reading's training data), ``other`` whether the sound
so far is more likely a backchannel or a noise (its words must come faster), and ``pause_model``
the semantic rule's verdict: the learned decisions are run the same way. Partial transcripts are not
simulated: only the final words of each probe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from duplex.config.session import BargeInConfig, SemanticTurnConfig, VadConfig
from duplex.models.local.asr import Heard
from duplex.runtime.contract import Transcript
from duplex.session.endpoint import EndOfTurnJudge, TurnJudgement
from duplex.session.overlap import Listening, OverlapJudge, OverlapVerdict
from duplex.session.overlap_sound import TraceBuilder
from duplex.session.overlap_words import Said
from duplex.session.turn_model import SoundTrace
from duplex.session.turns import SpeechPaused, SpeechStarted, SpeechStopped, TurnDetector
from duplex.session.vad import FrameClassifier
from duplex_tools.turn_corpus.ears import Ears
from duplex_tools.turn_corpus.render import Rendered

FRAME = 320  # 20 ms at 16 kHz
FRAME_MS = 20
BACKGROUND_CLEAR = 1600  # samples of the lead left out before the sound (its onset's prefix)
Hearing = Callable[[SoundTrace, str, int], Said]  # (the sound, its words, voiced ms) -> what they say
SoundHolds = Callable[[SoundTrace], bool]  # the sound at interrupt_ms (and on) -> held for its words


class WordsOf(Protocol):
    def hear(self, audio: np.ndarray) -> Heard: ...  # an overlap's final words (``Ears``)


class Deaf:
    """Ears that hear no words: the sound alone (the sound reading's training run)."""

    def hear(self, audio: np.ndarray) -> Heard:
        return Heard("", no_speech_prob=1.0, avg_logprob=0.0)


@dataclass
class Frames:
    audio: np.ndarray
    voiced: list[bool]


def frames_of(rendered: Rendered, vad: VadConfig, background_s: float = 0.0) -> Frames:
    """The clip's frames as the session's VAD hears them. ``background_s``: it heard the clip's
    background (its lead before the sound, looped) this long first, as in a call where the noise was
    there all along; 0: the noise starts with the clip, the VAD's noise floor not yet risen to it."""
    classifier = FrameClassifier(vad)
    _hear_background(classifier, rendered, background_s)
    n = len(rendered.audio) // FRAME
    voiced = [classifier.is_voiced(rendered.audio[i * FRAME:(i + 1) * FRAME]) for i in range(n)]
    return Frames(rendered.audio, voiced)


def _hear_background(classifier: FrameClassifier, rendered: Rendered, seconds: float) -> None:
    lead = rendered.audio[:max(FRAME, rendered.start - BACKGROUND_CLEAR)]  # the background alone
    pieces = max(1, len(lead) // FRAME)
    for k in range(round(seconds * 1000) // FRAME_MS):
        j = k % pieces
        classifier.is_voiced(lead[j * FRAME:(j + 1) * FRAME])


@dataclass
class OverlapRun:
    takeover: bool = False
    verdicts: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    decided_ms: int | None = None  # stream time of the interrupting verdict
    onset_ms: int | None = None
    examples: dict[tuple[int, str], SoundTrace] = field(default_factory=dict)  # (voiced ms, words) read -> sound
    checked: list[SoundTrace] = field(default_factory=list)  # the sounds read from interrupt_ms on
    held: bool = False  # one of them was held for its words


def run_overlap(frames: Frames, ears: WordsOf, barge_in: BargeInConfig, vad: VadConfig, asr_ms: int = 200,
                hearing: Hearing | None = None, sound: SoundHolds | None = None,
                other: SoundHolds | None = None) -> OverlapRun:
    run = OverlapRun()
    detector = TurnDetector(vad)
    prefix_frames = vad.prefix_padding_ms // FRAME_MS
    audio = frames.audio
    at = {"from": 0, "now": 0}  # frames of the overlap's audio (as the session's TurnAudio holds it)
    pieces = [(audio[j * FRAME:(j + 1) * FRAME], voiced) for j, voiced in enumerate(frames.voiced)]
    traces = TraceBuilder()  # as the session's listener: each frame of an overlap read once

    def trace() -> SoundTrace:
        return traces.trace(pieces[at["from"]:at["now"]])

    def says(text: str, voiced_ms: int) -> Said | None:
        if (voiced_ms, text) not in run.examples:
            run.examples[voiced_ms, text] = trace()
        sound = run.examples[voiced_ms, text]
        return None if hearing is None else hearing(sound, text, voiced_ms)

    def holds() -> bool:
        run.checked.append(trace())
        held = sound is not None and sound(run.checked[-1])
        run.held = run.held or held
        return held

    def sounds_other() -> bool:
        return other is not None and other(trace())

    listening: Listening[object] = Listening(says, holds, sounds_other if other is not None else None)
    reply = object()
    probe_from: int | None = None  # sample the open probe's audio begins at
    pending: tuple[int, Heard] | None = None  # words on their way: (arrival ms, the words)
    for i, voiced in enumerate(frames.voiced):
        now = (i + 1) * FRAME_MS
        at["now"] = i + 1
        settled: tuple[OverlapVerdict, object] | None = None
        if listening.active:
            settled = listening.push(FRAME_MS, voiced)
            if settled is None and probe_from is not None and listening.words_final_due():
                pending = (now + asr_ms, ears.hear(audio[probe_from:now * 16]))
                probe_from = None
            elif settled is None and voiced and listening.words_coming and probe_from is None and pending is None:
                listening.rehear()
                probe_from = at["from"] * FRAME
            if settled is None and pending is not None and now >= pending[0]:
                heard, pending = pending[1], None
                run.words.append(heard.text)
                settled = listening.heard(Transcript(heard.text, final=True, avg_logprob=heard.avg_logprob,
                                                     no_speech_prob=heard.no_speech_prob))
        else:
            cue = detector.push(i * FRAME_MS, voiced, min_speech_ms=min(vad.min_speech_ms, barge_in.pause_speech_ms))
            if isinstance(cue, SpeechStarted):
                onset = cue.onset_ms
                run.onset_ms = run.onset_ms if run.onset_ms is not None else onset
                voiced_ms = min(vad.min_speech_ms, barge_in.pause_speech_ms, now - onset)
                judge = OverlapJudge(barge_in, onset, now, voiced_ms, vad.silence_ms - vad.frame_ms,
                                     word_ms=vad.min_speech_ms)
                at["from"] = max(0, onset // FRAME_MS - prefix_frames)
                listening.begin(judge, reply, words=barge_in.words)
                probe_from, pending = at["from"] * FRAME, None
        if settled is not None:
            verdict = settled[0]
            run.verdicts.append(verdict.kind.value)
            probe_from, pending = None, None
            detector.reset()
            if verdict.interrupts:
                run.takeover, run.decided_ms = True, now
                break
    return run


@dataclass
class TurnRun:
    ended_ms: int | None = None  # the end of speech of the turn ended (None: not in the clip)
    decided_ms: int | None = None  # stream time the turn was ended
    judged: list[tuple[int, float, str, bool]] = field(default_factory=list)  # (pause end, P, words, complete)


class _Model:
    """Smart Turn's answer, already known (the ears cached it): the judge's coroutine ends at once."""

    def __init__(self, probability: float) -> None:
        self.probability = probability

    def prepare(self) -> None:
        return None

    async def complete_probability(self, audio: np.ndarray) -> float:
        return self.probability


def _run_now(coroutine: object) -> None:
    try:
        coroutine.send(None)  # type: ignore[attr-defined]
    except StopIteration:
        return
    raise RuntimeError("the judge awaited something that is not ready")


def run_turn(frames: Frames, ears: Ears, vad: VadConfig, semantic: SemanticTurnConfig | None,
             pause_model: Callable[[float, str], bool] | None = None) -> TurnRun:
    """Where the turn ends: by silence (``semantic`` None) or judged at its pauses."""
    run = TurnRun()
    if semantic is None:
        detector = TurnDetector(vad)
    else:
        detector = TurnDetector(vad, judge_ms=semantic.check_ms, silence_ms=semantic.longest_pause_ms)
    prefix = vad.prefix_padding_ms * 16
    start = 0
    audio = frames.audio
    for i, voiced in enumerate(frames.voiced):
        now = (i + 1) * FRAME_MS
        cue = detector.push(i * FRAME_MS, voiced)
        if isinstance(cue, SpeechStarted):
            start = max(0, cue.onset_ms * 16 - prefix)
        elif isinstance(cue, SpeechStopped):
            run.ended_ms, run.decided_ms = cue.end_ms, now
            return run
        elif isinstance(cue, SpeechPaused) and cue.judge and semantic is not None:
            turn = audio[start:now * 16]
            probability = ears.complete_probability(turn)
            text = ears.words(turn)
            verdicts: list[TurnJudgement] = []
            judge = EndOfTurnJudge(semantic, _Model(probability), _run_now, verdicts.append)
            judge.heard(text, final=True)
            judge.judge(cue.end_ms, turn.astype(np.float32) / 32768.0)
            complete = verdicts[0].complete if pause_model is None else pause_model(probability, text)
            run.judged.append((cue.end_ms, probability, text, complete))
            if complete and detector.end_now(cue.end_ms) is not None:
                run.ended_ms, run.decided_ms = cue.end_ms, now
                return run
    return run

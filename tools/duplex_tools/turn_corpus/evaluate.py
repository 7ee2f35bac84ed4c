"""Every clip of a corpus split through the decisions, in process (``simulate.py``): today's rules
(the listening barge-in with its word lists; end of turn by silence and by the semantic rule) and,
given a trained ``TurnModels``, the learned decisions, on the same frames and the same words: the
learned reading of the words and sound (``learned``), and today's rules with the learned reading of
the sound alone (``listen + sound``, the default: a sound it hears as a backchannel or a noise
is held for its words, and words over it must come faster).

Per clip, an ``Outcome`` per way: ``takeover`` is the agent taking the floor (for a pause: the
turn ended before the caller went on; for an overlap: the reply cut; for an interruption that is
honouring it; for a complete turn, answering it within the longest pause) and ``latency_ms``
(interruption: onset -> verdict; complete turn: end of speech -> end of turn)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from duplex.config.session import BargeInConfig, SemanticTurnConfig, VadConfig
from duplex.session.overlap_sound import sound_features
from duplex.session.overlap_words import Said
from duplex.session.turn_model import SAID, SoundTrace, TurnModels, overlap_features, pause_features
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.ears import Ears
from duplex_tools.turn_corpus.render import render
from duplex_tools.turn_corpus.simulate import Deaf, Frames, frames_of, run_overlap, run_turn

TODAY, SILENCE, LEARNED = "today (semantic + listen)", "silence + listen", "learned"
SOUND = "listen + sound"
OVERLAPS = ("backchannel", "noise", "interruption")


@dataclass(frozen=True)
class Outcome:
    clip: spec.Clip
    way: str
    takeover: bool
    latency_ms: float | None = None
    held: bool = False  # an overlap's sound was held for its words at interrupt_ms


@dataclass(frozen=True)
class JudgedPause:
    """A pause the semantic judge was asked about, as the pause reading learns it."""

    sentence: str  # what the clip says (``spec.sentence_of``): the unit ``folds.py`` holds out
    features: np.ndarray  # ``pause_features``
    label: str  # "complete" (the end of the clip's speech) | "open" (the caller went on)
    rules_end: bool  # today's rules ended the turn here


@dataclass
class Examples:
    """What the decisions read on the way (the learned model's training data)."""

    overlap: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (features, the clip's category)
    pauses: list[JudgedPause] = field(default_factory=list)
    sound: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (the sound's features at a reading, category)
    first_sound: list[tuple[np.ndarray, str]] = field(default_factory=list)  # the first reading of each overlap

    @property
    def pause(self) -> list[tuple[np.ndarray, str]]:
        """The pauses as the pause reading trains on them: (features, "complete" | "open")."""
        return [(p.features, p.label) for p in self.pauses]


@dataclass(frozen=True)
class Settings:
    vad: VadConfig = field(default_factory=VadConfig)
    barge_in: BargeInConfig = field(default_factory=BargeInConfig)
    semantic: SemanticTurnConfig = field(default_factory=lambda: SemanticTurnConfig(unclosed_at=0.9))  # local's
    asr_ms: int = 200  # the overlap's final words arrive this long after its probe closes
    background_s: float = 0.0  # the VAD heard the clip's background this long before it (``frames_of``)


def resumes_at(frames: Frames, pause_at: int) -> int:
    """Stream ms of the first voiced frame after the pause (where the caller goes on)."""
    start = pause_at // 320 + 5
    later = [i for i in range(start, len(frames.voiced)) if frames.voiced[i]]
    return (later[0] if later else len(frames.voiced)) * 20


def _overlap(clip: spec.Clip, frames: Frames, ears: Ears, settings: Settings, models: TurnModels | None,
             examples: Examples) -> list[Outcome]:
    today = run_overlap(frames, ears, settings.barge_in, settings.vad, settings.asr_ms)
    examples.overlap += [(overlap_features(trace, voiced_ms, text), clip.category)
                         for (voiced_ms, text), trace in today.examples.items()]
    # the sound reading's examples: the sound at every reading while it is held throughout (words
    # unheard: the reading comes before them), so every later reading of a held sound is there too
    throughout = run_overlap(frames, Deaf(), settings.barge_in, settings.vad, settings.asr_ms, sound=lambda _: True)
    examples.sound += [(sound_features(trace), clip.category) for trace in throughout.checked]
    examples.first_sound += examples.sound[len(examples.sound) - len(throughout.checked):][:1]
    out = [Outcome(clip, way, today.takeover, _span(today.onset_ms, today.decided_ms)) for way in (TODAY, SILENCE)]
    if models is not None and models.sound is not None:
        held = run_overlap(frames, ears, settings.barge_in, settings.vad, settings.asr_ms, sound=models.sound_holds,
                           other=models.sounds_other)
        out.append(Outcome(clip, SOUND, held.takeover, _span(held.onset_ms, held.decided_ms), held.held))
    if models is not None:
        def hearing(trace: SoundTrace, text: str, voiced_ms: int) -> Said:
            return SAID[models.overlap_kind(trace, voiced_ms, text)]

        learned = run_overlap(frames, ears, settings.barge_in, settings.vad, settings.asr_ms, hearing)
        out.append(Outcome(clip, LEARNED, learned.takeover, _span(learned.onset_ms, learned.decided_ms)))
    return out


def _span(start: int | None, end: int | None) -> float | None:
    return None if start is None or end is None else float(end - start)


def _turn(clip: spec.Clip, frames: Frames, ears: Ears, settings: Settings, models: TurnModels | None,
          pause_at: int | None, end: int, examples: Examples) -> list[Outcome]:
    resume_ms = resumes_at(frames, pause_at) if pause_at is not None else None
    end_ms = end // 16

    def outcome(way: str, decided_ms: int | None) -> Outcome:
        if resume_ms is not None:  # a pause: taken over if the turn ended before the caller went on
            return Outcome(clip, way, decided_ms is not None and decided_ms < resume_ms)
        answered = decided_ms is not None
        return Outcome(clip, way, answered, float(decided_ms - end_ms) if decided_ms is not None else None)

    silence = run_turn(frames, ears, settings.vad, None)
    semantic = run_turn(frames, ears, settings.vad, settings.semantic)
    for pause_end, probability, text, rules_end in semantic.judged:
        complete = pause_end >= end_ms - 60  # the end of the clip's speech, not a pause within it
        sentence = spec.sentence_of(clip.category, clip.variant)
        examples.pauses.append(JudgedPause(sentence, pause_features(probability, text),
                                           "complete" if complete else "open", rules_end))
    out = [outcome(TODAY, semantic.decided_ms), outcome(SILENCE, silence.decided_ms)]
    if models is not None:
        threshold = models.complete_at

        def pause_model(probability: float, text: str) -> bool:
            return models.pause_complete(probability, text) >= threshold

        learned = run_turn(frames, ears, settings.vad, settings.semantic, pause_model)
        out.append(outcome(LEARNED, learned.decided_ms))
    return out


def evaluate(cache: Path, split: str, models: TurnModels | None = None, full: bool = False,
             settings: Settings | None = None, progress: bool = True,
             categories: tuple[str, ...] = spec.CATEGORIES) -> tuple[list[Outcome], Examples]:
    settings = settings or Settings()
    ears = Ears(cache)
    outcomes: list[Outcome] = []
    examples = Examples()
    clips = spec.clips(split, full, categories)
    try:
        for n, clip in enumerate(clips):
            rendered = render(cache, clip)
            frames = frames_of(rendered, settings.vad, settings.background_s)
            if clip.category in OVERLAPS:
                outcomes += _overlap(clip, frames, ears, settings, models, examples)
            else:
                outcomes += _turn(clip, frames, ears, settings, models, rendered.pause_at, rendered.end, examples)
            if progress and (n + 1) % 100 == 0:
                print(f"  {n + 1}/{len(clips)} clips", file=sys.stderr, flush=True)
    finally:
        ears.save()
    return outcomes, examples

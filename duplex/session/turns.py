"""Turn detection and preemption policy: when a caller's turn starts, when a pause is long enough
to start answering (speculatively), when the caller resumes, when the turn ends and when it has
gone on too long. Pure decisions over the per-frame voiced verdicts (``vad.FrameClassifier``), on
stream time (ms of audio pushed), never wall time, so they are tested without a clock.

- start after ``min_speech_ms`` of voiced audio within ``start_window_ms``;
- go on after a silence began only with ``resume_speech_ms`` of voiced audio within
  ``start_window_ms`` (a lone voiced frame, a steady noise's peak, is part of the silence);
- end after ``silence_ms`` of unvoiced audio (``vad.silence_ms``; with semantic turns the longest
  pause, the judge in ``endpoint.py`` ending it sooner), or once it has lasted ``max_turn_s``;
- with preemptive generation on, a pause of ``pause_ms`` (shorter than ``silence_ms``) is
  reported, so the session can close the turn's input and start the answer while it waits out
  the rest of the silence; voice again after such a pause is reported as a resume;
- with semantic turns, a pause of ``judge_ms`` is reported for judging (with the speculation's
  cue when the two are equal; ``pause_ms`` may be shorter, so the answer is under way by then).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from duplex.config.session import SessionConfig, VadConfig
from duplex.session.states import TURN_TRANSITIONS, StateMachine, TurnPhase


class StopReason(str, enum.Enum):
    SILENCE = "silence"  # the end-of-turn silence went by
    MAX_LENGTH = "max_length"  # the turn was committed at the longest a turn may last
    JUDGED = "judged"  # a pause judged to end a complete turn (semantic turns, endpoint.py)


@dataclass(frozen=True)
class SpeechStarted:
    onset_ms: int  # stream time of the first voiced frame of the speech


@dataclass(frozen=True)
class SpeechStopped:
    end_ms: int  # stream time just after the last voiced frame (or the cut, at max length)
    reason: StopReason = StopReason.SILENCE


@dataclass(frozen=True)
class SpeechPaused:
    end_ms: int  # stream time just after the last voiced frame; the turn may still go on
    speculate: bool = True  # the pause is ``pause_ms`` long: start the answer
    judge: bool = False  # the pause is ``judge_ms`` long: judge whether the turn is over


@dataclass(frozen=True)
class SpeechResumed:
    at_ms: int  # stream time of the voiced frame that ended the pause


TurnCue = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


class TurnDetector:
    """The caller's turn as a small state machine (``states.TurnPhase``, its moves in
    ``states.TURN_TRANSITIONS``): quiet -> speaking -> paused and/or judged -> speaking again
    (a resume) or quiet (the turn ended). A move the table does not allow raises."""

    def __init__(self, config: VadConfig, pause_ms: int | None = None, max_turn_ms: int | None = None,
                 silence_ms: int | None = None, judge_ms: int | None = None) -> None:
        self.config = config
        self.pause_ms = pause_ms  # None: no speculation cues (preemption off)
        self.judge_ms = judge_ms  # None: no judging cues (turns end by silence)
        self.silence_ms = config.silence_ms if silence_ms is None else silence_ms
        self.max_turn_ms = max_turn_ms  # None: a turn may last forever
        self._machine = StateMachine("turn", TurnPhase.QUIET, TURN_TRANSITIONS)
        self._window: deque[tuple[int, bool]] = deque(maxlen=max(1, config.start_window_ms // config.frame_ms))
        self._unvoiced_ms = 0
        self._last_voiced_end_ms = 0
        self._onset_ms = 0

    @property
    def phase(self) -> TurnPhase:
        return self._machine.state

    @property
    def speaking(self) -> bool:
        """A turn is open (whatever its pause's cues)."""
        return self.phase is not TurnPhase.QUIET

    @property
    def paused(self) -> bool:
        """The speculation cue of the pause going on was reported (no voiced frame came since)."""
        return self.phase in (TurnPhase.PAUSED, TurnPhase.PAUSED_JUDGED)

    @property
    def judged(self) -> bool:
        """The judging cue of the pause going on was reported."""
        return self.phase in (TurnPhase.JUDGED, TurnPhase.PAUSED_JUDGED)

    @classmethod
    def for_session(cls, config: SessionConfig) -> TurnDetector:
        return cls(config.vad, config.pause_ms, round(1000 * config.max_turn_s), config.silence_ms, config.judge_ms)

    def push(self, frame_start_ms: int, voiced: bool, min_speech_ms: int | None = None) -> TurnCue | None:
        """One frame's verdict; returns the cue this frame completes, if any. ``min_speech_ms``: the
        voiced audio that starts a turn at this frame (default ``vad.min_speech_ms``; the session
        asks less while a reply that would only pause is live)."""
        frame_ms = self.config.frame_ms
        self._window.append((frame_start_ms, voiced))
        if voiced and self._goes_on():
            silence_from = self._last_voiced_end_ms
            self._unvoiced_ms = 0
            self._last_voiced_end_ms = frame_start_ms + frame_ms
            if self.paused or self.judged:  # the caller is back from the first voiced frame of the silence
                self._machine.move(TurnPhase.SPEAKING)
                return SpeechResumed(at_ms=next(start for start, v in self._window if v and start >= silence_from))
        elif not voiced:
            self._unvoiced_ms += frame_ms
        # (a voiced frame with too little voice yet to go on the turn neither ends its silence nor
        # lengthens it: a word's first frames do not make the pause before it longer)
        if not self.speaking:
            return self._maybe_start(self.config.min_speech_ms if min_speech_ms is None else min_speech_ms)
        if self._unvoiced_ms >= self.silence_ms:
            self.reset()
            return SpeechStopped(end_ms=self._last_voiced_end_ms)
        if (cue := self._pause_cue()) is not None:
            return cue
        if self.max_turn_ms is not None and frame_start_ms - self._onset_ms > self.max_turn_ms:
            self.reset()
            return SpeechStopped(end_ms=frame_start_ms + frame_ms, reason=StopReason.MAX_LENGTH)
        return None

    def _goes_on(self) -> bool:
        """A voiced frame goes on the turn: no silence has begun, or the window holds voice enough
        (``vad.resume_speech_ms``) to be the caller again, not a noise's peak. Before a turn the
        start rule (``_maybe_start``) decides."""
        if not self.speaking or self._unvoiced_ms == 0:
            return True
        return self.config.frame_ms * sum(1 for _, v in self._window if v) >= self.config.resume_speech_ms

    def _pause_cue(self) -> SpeechPaused | None:
        """The pause's speculation and judging cues, each once (one cue when both are due)."""
        speculate = self.pause_ms is not None and not self.paused and self._unvoiced_ms >= self.pause_ms
        judge = self.judge_ms is not None and not self.judged and self._unvoiced_ms >= self.judge_ms
        if not (speculate or judge):
            return None
        paused, judged = self.paused or speculate, self.judged or judge
        self._machine.move(TurnPhase.PAUSED_JUDGED if paused and judged else
                           TurnPhase.PAUSED if paused else TurnPhase.JUDGED)
        return SpeechPaused(end_ms=self._last_voiced_end_ms, speculate=speculate, judge=judge)

    def _maybe_start(self, min_speech_ms: int) -> SpeechStarted | None:
        voiced_ms = self.config.frame_ms * sum(1 for _, v in self._window if v)
        if voiced_ms < min_speech_ms:
            return None
        self._machine.move(TurnPhase.SPEAKING)
        self._onset_ms = next(start for start, v in self._window if v)
        return SpeechStarted(onset_ms=self._onset_ms)

    @property
    def pause_end_ms(self) -> int | None:
        """The end of speech of the pause going on now (it names the pause), or None."""
        return self._last_voiced_end_ms if self.speaking and (self.paused or self.judged) else None

    def end_now(self, pause_end_ms: int) -> SpeechStopped | None:
        """End the turn in the pause ``pause_end_ms`` (judged complete), if that pause still goes on."""
        if self.pause_end_ms != pause_end_ms:
            return None
        self.reset()
        return SpeechStopped(end_ms=pause_end_ms, reason=StopReason.JUDGED)

    def carry_on(self, onset_ms: int, last_voiced_end_ms: int, now_ms: int) -> None:
        """A turn that began at ``onset_ms`` is under way, whatever cues came since (the session
        judged an overlap an interruption while ignoring them): its voice last ended at
        ``last_voiced_end_ms``, and the silence since counts towards its end."""
        if self.phase is not TurnPhase.SPEAKING:
            self._machine.move(TurnPhase.SPEAKING)
        self._onset_ms = onset_ms
        self._last_voiced_end_ms = last_voiced_end_ms
        self._unvoiced_ms = max(0, now_ms - last_voiced_end_ms)

    def reset(self) -> None:
        if self.phase is not TurnPhase.QUIET:
            self._machine.move(TurnPhase.QUIET)
        self._window.clear()
        self._unvoiced_ms = 0

"""Barge-in that listens before it cuts: what a speech onset during the agent's reply turns out
to be. The reply's audio pauses at the onset; this judge watches the caller's audio from there,
frame by frame on stream time (no wall clock, so it is tested without one), and says once:

- ``INTERRUPTION``: the caller goes on speaking (``interrupt_ms`` voiced since the onset), or the
  overlap lasts ``max_overlap_ms``: the reply is stopped and the caller's turn goes on;
- ``BACKCHANNEL`` / ``NOISE``: the sound ended first (``resume_ms`` unvoiced): "uh-huh",
  "yeah", a cough, a knock. The reply resumes where it paused; nothing was aborted. Less than
  ``noise_ms`` of voiced audio is called noise, more a backchannel (the reply resumes either way).

A sound that starts within ``rejoin_ms`` of the end of one judged a backchannel continues it:
"Wait, stop." is two short sounds and one interruption (their voiced time and the pause
between them add up).

The judge decides from the sound alone (duration and voicing, the VAD's verdicts): a one-word
command shorter than ``interrupt_ms`` ("stop", "wait") resumes too. Sessions that want every
onset to interrupt set ``barge_in.mode: onset``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

from duplex.session.config import BargeInConfig

R = TypeVar("R")


class OverlapKind(str, enum.Enum):
    INTERRUPTION = "interruption"
    BACKCHANNEL = "backchannel"
    NOISE = "noise"


@dataclass(frozen=True)
class OverlapVerdict:
    kind: OverlapKind
    onset_ms: int  # stream time of the onset
    voiced_ms: int  # voiced audio heard since the onset (with that of a sound it continues)
    span_ms: int  # from the onset to the decision
    sound_end_ms: int  # stream time just after its last voiced frame

    @property
    def interrupts(self) -> bool:
        return self.kind is OverlapKind.INTERRUPTION


class OverlapJudge:
    def __init__(self, config: BargeInConfig, onset_ms: int, now_ms: int, voiced_ms: int,
                 turn_silence_ms: int | None = None) -> None:
        """``now_ms``: stream time when the onset was recognised (the VAD needs a few frames);
        ``voiced_ms``: voiced audio from the onset up to then; ``turn_silence_ms``: the silence
        that ends a turn, which a false onset's end must not outlast (so a short end-of-turn
        silence shortens ``resume_ms``)."""
        self.config = config
        self.resume_ms = config.resume_ms if turn_silence_ms is None else min(config.resume_ms, turn_silence_ms)
        self.onset_ms = onset_ms
        self.voiced_ms = voiced_ms
        self._end_ms = now_ms
        self._sound_end_ms = now_ms
        self._unvoiced_run_ms = 0

    def continues(self, previous: OverlapVerdict | None) -> None:
        """This sound follows ``previous`` (a backchannel or noise verdict of the same reply):
        within ``rejoin_ms`` of its end, they are one utterance: its voiced time and the gap
        between them (a pause between words) count as speech."""
        gap_ms = self.onset_ms - previous.sound_end_ms if previous is not None else None
        if previous is not None and gap_ms is not None and 0 <= gap_ms <= self.config.rejoin_ms:
            self.voiced_ms += previous.voiced_ms + gap_ms

    @property
    def span_ms(self) -> int:
        return self._end_ms - self.onset_ms

    def push(self, frame_ms: int, voiced: bool) -> OverlapVerdict | None:
        """One more frame of the caller's audio; the verdict once there is one."""
        self._end_ms += frame_ms
        if voiced:
            self.voiced_ms += frame_ms
            self._unvoiced_run_ms = 0
            self._sound_end_ms = self._end_ms
        else:
            self._unvoiced_run_ms += frame_ms
        cfg = self.config
        if self.voiced_ms >= cfg.interrupt_ms or self.span_ms >= cfg.max_overlap_ms:
            return self._verdict(OverlapKind.INTERRUPTION)
        if self._unvoiced_run_ms >= self.resume_ms:
            return self._verdict(OverlapKind.NOISE if self.voiced_ms < cfg.noise_ms else OverlapKind.BACKCHANNEL)
        return None

    def _verdict(self, kind: OverlapKind) -> OverlapVerdict:
        return OverlapVerdict(kind, self.onset_ms, self.voiced_ms, self.span_ms, self._sound_end_ms)


class Listening(Generic[R]):
    """A session's listening while a reply (``R``) is paused: the judge of the sound now, and
    the last sound a reply played on through (which a sound soon after continues)."""

    def __init__(self) -> None:
        self.judge: OverlapJudge | None = None
        self.reply: R | None = None
        self._last: tuple[OverlapVerdict, R] | None = None

    @property
    def active(self) -> bool:
        return self.judge is not None

    def begin(self, judge: OverlapJudge, reply: R) -> None:
        if self._last is not None and self._last[1] is reply:
            judge.continues(self._last[0])
        self.judge, self.reply = judge, reply

    def push(self, frame_ms: int, voiced: bool) -> tuple[OverlapVerdict, R] | None:
        """The verdict and the paused reply, once the judge has one (listening then ends)."""
        assert self.judge is not None and self.reply is not None
        verdict = self.judge.push(frame_ms, voiced)
        if verdict is None:
            return None
        reply = self.reply
        self.judge = self.reply = None
        if not verdict.interrupts:
            self._last = verdict, reply
        return verdict, reply

    def drop(self) -> None:
        self.judge = self.reply = None

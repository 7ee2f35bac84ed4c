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
between them add up). A sound too short to start a turn (a click, under ``vad.min_speech_ms``
voiced: it paused the reply only because ``pause_speech_ms`` is lower) is continued by none.

The sound alone (duration and voicing, the VAD's verdicts) cannot tell a one-word command
shorter than ``interrupt_ms`` ("stop", "no") from "yeah", nor "Sorry," followed by a pause from
"okay". Where the pipeline transcribes the overlap (``barge_in.words``, ``overlap_words.py``),
``Listening`` hears the words too:

- words that take the floor (``barge_in.min_words`` words that are not all a backchannel, or a
  word like "stop" or "sorry": ``overlap_words.what_words_say``) interrupt as soon as they are
  heard (a partial transcript may come before the sound has ended);
- the words are final once the sound has been over ``words_final_ms`` (the ASR's input closes
  then): a backchannel resumes the reply as soon as they come, before ``resume_ms`` of silence
  (the caller's "yeah" is answered by the reply going on within ~0.2 s, as a person would); a
  lone other word ("I", "way") may begin a sentence, and the reply stays paused until the sound
  has been over ``rejoin_ms``, then resumes;
- when the sound says "resume", the reply stays paused until the final words: a backchannel
  resumes it (``BACKCHANNEL``), words that take the floor interrupt, no words (or a lone other
  word, ``rejoin_ms`` after the sound) leave the sound's verdict. A
  noise waits too, though no word of it counts: "Wait," over a phone line is under ``noise_ms``
  voiced, and the hold keeps the reply from resuming before the rest of the sentence cuts it;
- words that are not back ``words_wait_ms`` after the sound's end, or a probe that ends without
  them, leave the sound's verdict too: the decision never hangs on the ASR;
- words the sound could not have said, or the recogniser was not sure of, or too few for the
  voice they came with (``overlap_words.credible``: Whisper's sentences made up from a cough, its
  few words made up over a long hum) are no words; over a sound the learned reading hears as
  more likely a backchannel or a noise (``turn_model.read_other``), words must come faster.

The sound's time alone also cuts doubled backchannels ("mm-hmm, mm-hmm", "yeah yeah") and long
noises (a keyboard, a laugh, music) at ``interrupt_ms`` or ``max_overlap_ms``, before any word of
them is heard. With ``barge_in.sound: learned``, where the words are coming, the judge asks the
learned reading of the sound so far (``turn_model.read_sound``: its bursts, pitch, flatness, level
and how its level contour repeats) whenever one of those two would interrupt: a sound it hears as a
backchannel or a noise is held for its words instead (the verdict says ``held``). A held sound is
read again every ``RECHECK_MS``; read then as a caller taking the floor, it interrupts. Otherwise
it interrupts by its words, or when the overlap lasts ``max_held_ms`` (twice
``max_overlap_ms`` unless set); when it ends it is judged
as any sound that ended.

Sessions that want every onset to interrupt set ``barge_in.mode: onset``: nothing pauses, and
the onset is an interruption decided by its sound the moment it is recognised (``at_onset``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from duplex.config.session import BargeInConfig
from duplex.runtime.contract import Transcript
from duplex.session.overlap_words import Said, counts_the_pace, credible, spoken_words, what_words_say
from duplex.session.states import LISTEN_TRANSITIONS, ListenPhase, StateMachine

R = TypeVar("R")
RECHECK_MS = 200  # a sound held for its words is read again this much later (a syllable or two)


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
    words: str | None = None  # the transcript that decided it; None: decided by the sound
    at_onset: bool = False  # decided when the onset was recognised (``barge_in.mode: onset``); nothing was paused
    held: bool = False  # from ``interrupt_ms`` on the sound was heard as no interruption and held for its words

    @property
    def interrupts(self) -> bool:
        return self.kind is OverlapKind.INTERRUPTION


def at_onset(onset_ms: int, now_ms: int, voiced_ms: int) -> OverlapVerdict:
    """``barge_in.mode: onset``: the onset recognised at ``now_ms`` is an interruption, its
    sound taken to go on: no judge is waited for."""
    return OverlapVerdict(OverlapKind.INTERRUPTION, onset_ms, voiced_ms, now_ms - onset_ms, now_ms, at_onset=True)


class OverlapJudge:
    def __init__(self, config: BargeInConfig, onset_ms: int, now_ms: int, voiced_ms: int,
                 turn_silence_ms: int | None = None, word_ms: int = 0) -> None:
        """``now_ms``: stream time when the onset was recognised (the VAD needs a few frames);
        ``voiced_ms``: voiced audio from the onset up to then; ``turn_silence_ms``: the silence
        that ends a turn, which a false onset's end must not outlast (so a short end-of-turn
        silence shortens ``resume_ms``); ``word_ms``: voiced audio a sound needs to be continued
        by the next (the VAD's ``min_speech_ms``)."""
        self.config = config
        self.word_ms = word_ms
        self.resume_ms = config.resume_ms if turn_silence_ms is None else min(config.resume_ms, turn_silence_ms)
        self.onset_ms = onset_ms
        self.voiced_ms = voiced_ms
        self._end_ms = now_ms
        self._sound_end_ms = now_ms
        self._unvoiced_run_ms = 0
        self._sound_reading: Callable[[], bool] | None = None
        self._read_span_ms: int | None = None  # the span at the last reading of the sound
        self._holding = False  # the last reading held the sound for its words
        self.held = False  # a reading held it

    def hold_for_words(self, reading: Callable[[], bool] | None) -> None:
        """``reading`` (where the words are coming): asked, when the sound's time would
        interrupt (and every ``RECHECK_MS`` after while it holds), whether the sound so far is a
        backchannel or a noise; True holds it for its words."""
        self._sound_reading = reading

    def _held_by_sound(self) -> bool:
        if self._sound_reading is None:
            return False
        if self._read_span_ms is None or self.span_ms >= self._read_span_ms + RECHECK_MS:
            self._holding = bool(self._sound_reading())
            self.held = self.held or self._holding
            self._read_span_ms = self.span_ms
        return self._holding

    def continues(self, previous: OverlapVerdict | None) -> None:
        """This sound follows ``previous`` (a backchannel or noise verdict of the same reply):
        within ``rejoin_ms`` of its end, they are one utterance: its voiced time and the gap
        between them (a pause between words) count as speech."""
        if previous is None or previous.voiced_ms < self.word_ms:
            return  # a click is no word of an utterance
        gap_ms = self.onset_ms - previous.sound_end_ms
        if 0 <= gap_ms <= self.config.rejoin_ms:
            self.voiced_ms += previous.voiced_ms + gap_ms

    @property
    def span_ms(self) -> int:
        return self._end_ms - self.onset_ms

    @property
    def sound_ended_ms(self) -> int:
        """Unvoiced audio since the sound's last voiced frame."""
        return self._unvoiced_run_ms

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
        if self.voiced_ms >= cfg.interrupt_ms and not self._held_by_sound():
            return self._verdict(OverlapKind.INTERRUPTION)
        # a sound that has ended is judged so however long ago it began (its words may be awaited)
        if self._unvoiced_run_ms >= self.resume_ms:
            return self._verdict(self.sound_kind())
        if self.span_ms >= cfg.max_overlap_ms and not self._held_by_sound():
            return self._verdict(OverlapKind.INTERRUPTION)
        if self.span_ms >= cfg.held_limit_ms:  # held for its words no longer
            return self._verdict(OverlapKind.INTERRUPTION)
        return None

    def sound_kind(self) -> OverlapKind:
        """What the sound heard so far is, if it is over: noise or a backchannel, by its voiced time."""
        return OverlapKind.NOISE if self.voiced_ms < self.config.noise_ms else OverlapKind.BACKCHANNEL

    def now(self, kind: OverlapKind) -> OverlapVerdict:
        """A verdict of ``kind`` on what was heard so far (the words decided it)."""
        return self._verdict(kind)

    def _verdict(self, kind: OverlapKind) -> OverlapVerdict:
        return OverlapVerdict(kind, self.onset_ms, self.voiced_ms, self.span_ms, self._sound_end_ms,
                              held=self.held)


class Listening(Generic[R]):
    """A session's listening while a reply (``R``) is paused: the judge of the sound now, the
    words heard of it (when they are coming), and the last sound a reply played on through (which
    a sound soon after continues)."""

    def __init__(self, hearing: Callable[[str, int], Said | None] | None = None,
                 sound: Callable[[], bool] | None = None, sounds_other: Callable[[], bool] | None = None) -> None:
        """``hearing``: what an overlap's words (and the sound they came with) say, read by the
        learned decision (``turn_model``): given the transcript and the voiced ms; None from it,
        or no ``hearing``: the word lists' reading (``overlap_words``). ``sound``: the reading
        of the sound so far at ``interrupt_ms`` (True: a backchannel or a noise, held for the
        words; asked only where the words are coming). ``sounds_other``: whether the sound so far
        is more likely a backchannel or a noise than a caller taking the floor (its words must
        then come faster: ``barge_in.max_voiced_ms_per_word_other``); asked only of words that
        the ceiling could undo."""
        self._hearing = hearing
        self._sound = sound
        self._sounds_other = sounds_other
        self._other_read: tuple[OverlapJudge, int, bool] | None = None  # (judge, its span, the reading)
        self._machine = StateMachine("listening", ListenPhase.IDLE, LISTEN_TRANSITIONS)
        self.judge: OverlapJudge | None = None  # set while not idle
        self.reply: R | None = None  # ... and the reply paused
        self._last: tuple[OverlapVerdict, R] | None = None
        self._words_coming = False  # the overlap's audio is being transcribed
        self._final: Transcript | None = None  # its final words (and their confidence), once heard
        self._held: OverlapVerdict | None = None  # waiting for the words: the sound's resume verdict

    @property
    def phase(self) -> ListenPhase:
        return self._machine.state

    @property
    def active(self) -> bool:
        return self.phase is not ListenPhase.IDLE

    @property
    def words_coming(self) -> bool:
        """The overlap's audio is being transcribed (and the transcription has not failed)."""
        return self._words_coming

    @property
    def waiting_words(self) -> bool:
        """The sound has ended (it would resume the reply) and its final words are awaited."""
        return self.phase is ListenPhase.WAITING_WORDS

    def _hold(self, verdict: OverlapVerdict | None) -> None:
        """The sound's resume verdict held for the words (None: the sound goes on, or is decided)."""
        self._held = verdict
        phase = ListenPhase.JUDGING if verdict is None else ListenPhase.WAITING_WORDS
        if self.phase is not phase:
            self._machine.move(phase)

    def words_final_due(self) -> bool:
        """The sound has been over long enough that its words are final (or it says resume)."""
        return self._words_coming and (self._held is not None or self._sound_over())

    def _sound_over(self) -> bool:
        """``words_final_ms`` unvoiced since the sound's last voiced frame."""
        return self.judge is not None and self.judge.sound_ended_ms >= self.judge.config.words_final_ms

    def begin(self, judge: OverlapJudge, reply: R, words: bool = False) -> None:
        """``words``: the overlap's audio is being transcribed; ``heard`` will tell its words."""
        if self._last is not None and self._last[1] is reply:
            judge.continues(self._last[0])
        judge.hold_for_words(self._sound if words else None)
        self._machine.move(ListenPhase.JUDGING)
        self.judge, self.reply = judge, reply
        self._words_coming, self._final, self._held = words, None, None

    def push(self, frame_ms: int, voiced: bool) -> tuple[OverlapVerdict, R] | None:
        """The verdict and the paused reply, once there is one (listening then ends)."""
        assert self.judge is not None and self.reply is not None
        verdict = self.judge.push(frame_ms, voiced)
        if verdict is None or verdict.interrupts or not self._words_coming:
            self._hold(None)  # the sound goes on (or is decided): its end is still to come
            return None if verdict is None else self._settle(verdict)
        if self._final is not None and not self._more_to_come(self._final):
            return self._settle(self._by_words(verdict, self._final))
        self._hold(verdict)
        if self.judge.sound_ended_ms >= self.judge.config.words_wait_ms:
            return self._settle(verdict)  # no words in time: the sound decides
        return None

    def heard(self, words: Transcript) -> tuple[OverlapVerdict, R] | None:
        """Words of the overlap (a partial or the final transcript, with the recogniser's
        confidence where it gives one); the verdict if they decide it."""
        if self.judge is None or not self._words_coming:
            return None
        said = self._says(words, self.judge.voiced_ms)
        if said is Said.FLOOR:  # "sorry", "stop": an interruption, whatever comes
            return self._settle(replace(self.judge.now(OverlapKind.INTERRUPTION), words=words.text))
        if words.final:
            self._final = words
            if self._held is not None and not self._more_to_come(words):
                return self._settle(self._by_words(self._held, words))
            if said is Said.BACKCHANNEL and self._sound_over():
                return self._settle(replace(self.judge.now(OverlapKind.BACKCHANNEL), words=words.text))
        return None

    def _more_to_come(self, words: Transcript) -> bool:
        """A lone word that is neither a backchannel nor takes the floor ("way": Whisper's hearing
        of a Piper "Wait,") may begin a sentence: the reply stays paused until the sound has been
        over ``rejoin_ms`` (more words continue it), and only then resumes."""
        assert self.judge is not None
        too_few = self._says(words, self.judge.voiced_ms) is Said.TOO_FEW
        return too_few and self.judge.sound_ended_ms < self.judge.config.rejoin_ms

    def words_lost(self) -> tuple[OverlapVerdict, R] | None:
        """The transcription ended without final words: the sound decides alone (now, if it had)."""
        if self.judge is None or self._final is not None:
            return None
        self._words_coming = False
        held = self._held
        self._hold(None)
        return self._settle(held) if held is not None else None

    def rehear(self) -> None:
        """The caller spoke again after the words' transcription closed: the whole overlap is
        being transcribed anew, and the words heard so far say no more than the sound."""
        self._words_coming, self._final = True, None

    def drop(self) -> None:
        if self.active:
            self._machine.move(ListenPhase.IDLE)
        self.judge = self.reply = self._held = self._other_read = None

    def _says(self, words: Transcript, voiced_ms: int) -> Said:
        """What ``words`` say, when a sound with ``voiced_ms`` of voice could have said them and
        the recogniser was sure enough of them (else nothing: a noise Whisper put words to)."""
        assert self.judge is not None
        learned = self._hearing(words.text, voiced_ms) if self._hearing is not None else None
        if learned is not None:
            return learned
        config = self.judge.config
        spoken = spoken_words(words.text)
        heard = credible(spoken, voiced_ms, config.noise_ms, words.avg_logprob, config.min_logprob,
                         self._ceiling(spoken, config))
        return what_words_say(spoken if heard else [], config.min_words)

    def _ceiling(self, spoken: list[str], config: BargeInConfig) -> int | None:
        """The most voiced ms a word may have come with (``credible``): lower over a sound that is
        more likely a backchannel or a noise (the sound is read only where the ceiling counts)."""
        ceiling, other = config.max_voiced_ms_per_word, config.max_voiced_ms_per_word_other
        if other is None or self._sounds_other is None or not counts_the_pace(spoken) or not self._sound_is_other():
            return ceiling
        return other if ceiling is None else min(ceiling, other)

    def _sound_is_other(self) -> bool:
        """``sounds_other``, read once per sound so far: one transcript's words are weighed up to
        three times, and each reading costs the event loop a millisecond or so."""
        assert self.judge is not None and self._sounds_other is not None
        judge, span_ms = self.judge, self.judge.span_ms
        if self._other_read is None or self._other_read[0] is not judge or self._other_read[1] != span_ms:
            self._other_read = (judge, span_ms, self._sounds_other())
        return self._other_read[2]

    def _by_words(self, verdict: OverlapVerdict, words: Transcript) -> OverlapVerdict:
        """The sound said resume; the final words say what it was (none: the sound's verdict)."""
        said = self._says(words, verdict.voiced_ms)
        if said is Said.BACKCHANNEL:
            return replace(verdict, kind=OverlapKind.BACKCHANNEL, words=words.text)
        if said is Said.FLOOR:
            return replace(verdict, kind=OverlapKind.INTERRUPTION, words=words.text)
        return verdict  # no words, or too few to take the floor: the sound's verdict

    def _settle(self, verdict: OverlapVerdict) -> tuple[OverlapVerdict, R]:
        reply = self.reply
        assert reply is not None
        self._machine.move(ListenPhase.IDLE)
        self.judge = self.reply = self._held = self._other_read = None
        if not verdict.interrupts:
            self._last = verdict, reply
        return verdict, reply

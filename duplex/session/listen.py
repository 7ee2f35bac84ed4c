"""The session's barge-in: a speech onset while a reply is live. It is decided here, in either
mode, as an ``overlap.OverlapVerdict``; an interruption is the session's to act on
(``ListenHost.interrupted_by``: it stops the reply and opens the caller's turn from the onset
with all its audio). ``barge_in.mode: onset`` decides at once: an interruption. ``listen`` (the
barge-in that listens) pauses the reply at the onset (the response is ``paused``), judges the
overlap frame by frame (``overlap.Listening``) and by the words the pipeline's ASR hears of it
(``overlap_words.OverlapEars``), then settles: a backchannel or a noise resumes the reply here.

``BargeInListener`` is one part of a ``VoiceSession``; ``ListenHost`` says what it reads and
changes of the session, and nothing else of it is touched."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from duplex.config.session import SessionConfig
from duplex.runtime.contract import CallerAudio, Transcript
from duplex.session.counters import SessionCounters
from duplex.session.overlap import Listening, OverlapJudge, OverlapVerdict, at_onset
from duplex.session.overlap_sound import SoundTrace, TraceBuilder
from duplex.session.overlap_words import OverlapEars, Said
from duplex.session.playout import AudioClear, Playout
from duplex.session.port import VoiceRuntime
from duplex.session.response import Response
from duplex.session.turn_audio import TurnAudio
from duplex.session.turn_model import read_other, read_overlap, read_sound
from duplex.session.turns import TurnDetector


class OverlapTeller(Protocol):
    """What the listener tells the client (the session's ``realtime.announce.Announcer`` spells it): the
    conversation core names what happened and knows no wire events."""

    def paused(self, response: Response, played_ms: int, onset_ms: int) -> None: ...

    def overlap_judged(self, response: Response, verdict: OverlapVerdict) -> None: ...

    def resumed(self, response: Response, played_ms: int, verdict: OverlapVerdict) -> None: ...


class ListenHost(Protocol):
    """What the listener needs of its session."""

    config: SessionConfig
    playout: Playout
    audio: TurnAudio
    detector: TurnDetector
    counters: SessionCounters
    last_barge_in_ms: float | None

    @property
    def tell(self) -> OverlapTeller: ...

    @property
    def stream_ms(self) -> int: ...  # caller audio classified so far

    def time_at(self, stream_ms: int) -> float: ...  # when that stream position arrived (monotonic)

    def now(self) -> float: ...

    def clear_audio(self, why: AudioClear) -> None: ...  # the door drops what its far end queued

    def interrupted_by(self, verdict: OverlapVerdict, response: Response) -> None: ...


class BargeInListener:
    def __init__(self, host: ListenHost, runtime: VoiceRuntime, session_id: str,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._host = host
        # a reply paused at an onset (overlap.py)
        self._listening: Listening[Response] = Listening(self._hear, self._sound_holds, self._sounds_other)
        self._traces = TraceBuilder()  # the sound of the overlap being judged, for the learned readings
        self.ears = OverlapEars(runtime, session_id, spawn, self._on_words,
                                lambda: self._settle_if(self._listening.words_lost()))

    @property
    def active(self) -> bool:
        """An overlap is being judged: the detector's cues do not count meanwhile. Its reply is
        ``paused`` unless that reply's audio had not begun at the onset."""
        return self._listening.active

    @property
    def hearing(self) -> bool:
        """The overlap's audio still goes to the ears (``feed`` it)."""
        return self.ears.input_open

    def feed(self, audio: CallerAudio) -> None:
        self.ears.feed(audio)

    def barge_in(self, response: Response, onset_ms: int) -> None:
        """A speech onset while ``response`` is live (the turn's audio is open from the onset)."""
        host = self._host
        if host.config.barge_in.mode == "onset":
            voiced_ms = min(host.config.vad.min_speech_ms, host.stream_ms - onset_ms)  # what started the turn
            host.interrupted_by(at_onset(onset_ms, host.stream_ms, voiced_ms), response)
        else:
            self.pause(response, onset_ms)

    def pause(self, response: Response, onset_ms: int) -> None:
        """An onset during the reply: silence it now, keep it alive, and listen (``overlap.py``).
        A reply announced whose audio has not begun has nothing to hold: it is judged unpaused."""
        host = self._host
        played = response.played_ms
        if response.audio_began:
            response.pause()
            played = host.playout.pause()
        host.last_barge_in_ms = 1000 * (host.now() - host.time_at(onset_ms))
        vad, barge_in = host.config.vad, host.config.barge_in
        # the voiced audio that started this onset: a live reply in listen mode asks only this much
        voiced_ms = min(vad.min_speech_ms, barge_in.pause_speech_ms, host.stream_ms - onset_ms)
        judge = OverlapJudge(barge_in, onset_ms, host.stream_ms, voiced_ms, vad.silence_ms - vad.frame_ms,
                             word_ms=vad.min_speech_ms)
        words = barge_in.words and host.config.overlap_probe_request
        self._listening.begin(judge, response, words)
        host.tell.paused(response, played, onset_ms)
        host.clear_audio(AudioClear.PAUSED)  # what the far end queued would play over the judging
        if words:  # the pipeline's ASR hears the overlap from its onset's prefix on
            self.ears.start(host.audio.take_pending())

    def listen(self, voiced: bool) -> None:
        """One more frame of an overlap: the judge's verdict, if any; the ears told of the
        sound's end (``words_final_ms`` unvoiced: its final words), or of a sound after its
        words came (hear it all again; a sound while they are still coming waits for them: they
        may settle it)."""
        host = self._host
        settled = self._listening.push(host.config.vad.frame_ms, voiced)
        if settled is not None:
            self._settle(*settled)
        elif self.ears.input_open and self._listening.words_final_due():
            self.ears.feed(host.audio.take_pending(), eos=True)
        elif voiced and self._listening.words_coming and not self.ears.live:
            self._listening.rehear()  # its words so far were heard; what follows is heard anew
            self.ears.start(host.audio.replay())

    def drop(self) -> None:
        """Nothing to judge any more (the client cleared the input): the paused reply plays on."""
        if self._listening.active:
            reply = self._listening.reply
            self._listening.drop()
            self.ears.stop()
            if reply is not None and reply.paused:
                reply.resume()
            self._host.playout.resume()

    def stop(self) -> None:
        """The session closes: no probe is left running."""
        self.ears.stop()

    def _hear(self, text: str, voiced_ms: int) -> Said | None:
        """``barge_in.judge: learned``: what the overlap's words and sound say, read by the learned
        model (``turn_model``) from the overlap's frames so far; None: the word lists read them."""
        if self._host.config.barge_in.judge != "learned":
            return None
        return read_overlap(self._trace(), text, voiced_ms)

    def _sound_holds(self) -> bool:
        """``barge_in.sound: learned``: whether the overlap's sound so far (its frames from the
        onset's prefix on), at ``interrupt_ms`` voiced, is heard as a backchannel or a noise and
        held for its words; False: the voiced time interrupts."""
        if self._host.config.barge_in.sound != "learned":
            return False
        return read_sound(self._trace())

    def _sounds_other(self) -> bool:
        """``barge_in.sound: learned``: whether the overlap's sound so far is more likely a
        backchannel or a noise than a caller taking the floor (its words must come faster)."""
        if self._host.config.barge_in.sound != "learned":
            return False
        return read_other(self._trace())

    def _trace(self) -> SoundTrace:
        """The overlap's sound so far, its frames from the onset's prefix on (each read once)."""
        return self._traces.trace(self._host.audio.frames())

    def _on_words(self, transcript: Transcript) -> None:
        self._settle_if(self._listening.heard(transcript))

    def _settle_if(self, settled: tuple[OverlapVerdict, Response] | None) -> None:
        if settled is not None:
            self._settle(*settled)

    def _settle(self, verdict: OverlapVerdict, response: Response) -> None:
        host = self._host
        self.ears.stop()
        self._traces.clear()
        host.tell.overlap_judged(response, verdict)
        if verdict.interrupts:
            host.interrupted_by(verdict, response)
            return
        host.detector.reset()  # the sound is over: no turn
        host.audio.close()
        if response.paused:
            response.resume()
            host.playout.resume()
        # a reply unpaused at the onset (no audio yet) whose audio began while judged is told of too
        if response.audio_began:
            host.counters.resumed += 1
            host.tell.resumed(response, host.playout.played_ms, verdict)

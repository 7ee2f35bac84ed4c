"""The session's barge-in that listens (``barge_in.mode: listen``): the reply paused at an onset,
the overlap judged frame by frame (``overlap.Listening``) and by the words the pipeline's ASR
hears of it (``overlap_words.OverlapEars``), then settled: an interruption opens the caller's
turn from the onset with all its audio, a backchannel or a noise resumes the reply.

A part of ``VoiceSession`` (it inherits this), kept apart so each file stays readable; the
attributes and methods declared below are the session's."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from duplex.runtime.contract import Transcript
from duplex.session.announce import Announcer
from duplex.session.clock import InputFrames
from duplex.session.config import SessionConfig
from duplex.session.observe import SessionCounters
from duplex.session.overlap import Listening, OverlapJudge, OverlapVerdict
from duplex.session.overlap_words import OverlapEars
from duplex.session.playout import Playout
from duplex.session.port import VoiceRuntime
from duplex.session.response import Response
from duplex.session.turn_audio import TurnAudio
from duplex.session.turns import TurnDetector


class ListeningSession:
    config: SessionConfig
    playout: Playout
    audio: TurnAudio
    detector: TurnDetector
    tell: Announcer
    counters: SessionCounters
    last_barge_in_ms: float | None
    _input: InputFrames
    _stream_ms: int
    _clock: Callable[[], float]

    def _init_listening(self, runtime: VoiceRuntime, session_id: str,
                        spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._listening: Listening[Response] = Listening()  # a reply paused at an onset (overlap.py)
        self.ears = OverlapEars(runtime, session_id, spawn, self._on_overlap_words,
                                lambda: self._settle_if(self._listening.words_lost()))

    # the session's (session.py)
    def _interrupt(self, reason: str, onset_time: float | None, audio_end_ms: int | None = None) -> None:
        raise NotImplementedError

    def _count_barge_in(self, response: Response, stop_ms: float) -> None:
        raise NotImplementedError

    def _open_turn(self, onset_ms: int, replay: bool = False) -> None:
        raise NotImplementedError

    def _pause(self, response: Response, onset_ms: int) -> None:
        """An onset during the reply: silence it now, keep it alive, and listen (``overlap.py``)."""
        played = self.playout.pause() if self.playout.item_id == response.item_id else response.played_ms
        self.last_barge_in_ms = 1000 * (self._clock() - self._input.clock.time_at(onset_ms))
        voiced_ms = min(self.detector.min_speech_ms, self._stream_ms - onset_ms)
        vad = self.config.vad
        judge = OverlapJudge(self.config.barge_in, onset_ms, self._stream_ms, voiced_ms, vad.silence_ms - vad.frame_ms,
                             word_ms=vad.min_speech_ms)
        words = self.config.barge_in.words and self.config.overlap_probe_request
        self._listening.begin(judge, response, words)
        self.tell.paused(response, played, onset_ms)
        if words:  # the pipeline's ASR hears the overlap from its onset's prefix on
            self.ears.start(self.audio.take_pending())

    def _listen(self, voiced: bool) -> None:
        """One more frame of an overlap: the judge's verdict, if any; the ears told of the
        sound's end (``words_final_ms`` unvoiced: its final words), or of a sound after its
        words came (hear it all again; a sound while they are still coming waits for them: they
        may settle it)."""
        settled = self._listening.push(self.config.vad.frame_ms, voiced)
        if settled is not None:
            self._settle_overlap(*settled)
        elif self.ears.input_open and self._listening.words_final_due():
            self.ears.feed(self.audio.take_pending(), eos=True)
        elif voiced and self._listening.words_coming and not self.ears.live:
            self._listening.rehear()  # its words so far were heard; what follows is heard anew
            self.ears.start(self.audio.replay())

    def _on_overlap_words(self, transcript: Transcript) -> None:
        self._settle_if(self._listening.heard(transcript.text, transcript.final))

    def _settle_if(self, settled: tuple[OverlapVerdict, Response] | None) -> None:
        if settled is not None:
            self._settle_overlap(*settled)

    def _settle_overlap(self, verdict: OverlapVerdict, response: Response) -> None:
        self.ears.stop()
        self.tell.overlap_judged(response, verdict)
        if verdict.interrupts:
            if response.live:
                self._interrupt("turn_detected", None)
                self._count_barge_in(response, self.last_barge_in_ms or 0.0)
            # the caller's turn goes on from the onset, whatever the detector made of the pauses
            self.detector.carry_on(verdict.onset_ms, verdict.sound_end_ms, self._stream_ms)
            self._open_turn(verdict.onset_ms, replay=True)
            return
        self.detector.reset()  # the sound is over: no turn
        self.audio.close()
        if response.live and self.playout.item_id == response.item_id:
            self.playout.resume()
            self.counters.resumed += 1
            self.tell.resumed(response, self.playout.played_ms, verdict)

"""One conversation: caller audio in -> VAD -> turns -> runtime; agent audio out; barge-in.

The transport pushes the caller's audio (16 kHz mono int16) as it arrives and pulls one output
frame every ``frame_ms``; everything else the session decides itself. It runs on one asyncio
loop; nothing here blocks.

States: ``idle`` (listening) -> ``user_speaking`` (VAD onset; the turn's audio streams to the
runtime) -> ``responding`` (end of speech; waiting for the first agent audio) ->
``agent_speaking`` (agent audio is being played) -> ``idle`` when it has all been played. Speech
onset in ``responding`` or ``agent_speaking`` is a barge-in: the output is flushed at once, the
response aborted in every stage, the client told where its audio was cut, and a new turn begins.

Preemptive generation (``preemptive_generation.enabled``): a pause of ``pause_ms`` while the
user speaks closes the turn's input, so the pipeline starts answering during the rest of the
end-of-turn silence; that speculative response's outputs are held, not played. Voice again
before the silence completes aborts it (the runtime abort) and the whole turn's audio so far
goes into a fresh request; the silence completing releases the held outputs at once.

What the caller heard of an interrupted response travels with the session's next request as
params ``truncate`` (and a superseded speculative request as ``supersedes``), so a pipeline that
keeps history can keep only the heard part; see ``_interrupt`` and docs/edge.md.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from typing import Callable

import av
import numpy as np

from duplex.session import events as ev
from duplex.session.clock import InputClock
from duplex.session.config import SessionConfig
from duplex.session.echo import EchoGate
from duplex.session.playout import OutputFormat, Playout
from duplex.session.response import Response
from duplex.session.runtime_port import Turn, TurnEnded, TurnOutput, VoiceRuntime
from duplex.session.vad import (
    SAMPLE_RATE,
    FrameClassifier,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)

log = logging.getLogger("duplex.session")
FEED_MS = 100  # user audio goes to the runtime in chunks this long while the user speaks


class State(str, enum.Enum):
    IDLE = "idle"
    USER_SPEAKING = "user_speaking"
    RESPONDING = "responding"
    AGENT_SPEAKING = "agent_speaking"
    CLOSED = "closed"


class VoiceSession:
    def __init__(self, session_id: str, runtime: VoiceRuntime, config: SessionConfig,
                 send: Callable[[ev.ServerEvent], None], output_format: OutputFormat = OutputFormat(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session_id = session_id
        self.runtime = runtime
        self.config = config
        self._send = send
        self._clock = clock
        self.state = State.IDLE
        self.classifier = FrameClassifier(config.vad)
        self.detector = TurnDetector(config.vad, config.pause_ms)
        self.echo = EchoGate(config.echo)
        self.playout = Playout(output_format)
        self._reference = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        self._input_clock = InputClock()
        self._pending = np.zeros(0, np.int16)
        self._stream_ms = 0  # caller audio classified so far: the stream time Realtime events use
        self._recent: deque[np.ndarray] = deque(maxlen=self._recent_frames())
        self._to_feed: list[np.ndarray] = []
        self._turn_audio: list[np.ndarray] = []  # the whole user turn so far (a fresh request replays it)
        self._pending_edits: dict = {}  # history edits for the next turn's params (truncate)
        self._turn_edits: dict = {}  # ... and those of the turn in progress (every request of it)
        self._event_count = 0
        self._item_count = 0
        self._turn_count = 0
        self._user_item: str | None = None
        self._turn_started_ms = 0
        self._user_turn: Turn | None = None
        self._response: Response | None = None
        self._tasks: set[asyncio.Task] = set()
        self.counters = {"turns": 0, "responses": 0, "barge_ins": 0, "cancelled": 0, "errors": 0,
                         "preemptive_starts": 0, "preemptive_aborts": 0, "preemptive_commits": 0}
        self.last_ttfa_ms: float | None = None
        self.last_barge_in_ms: float | None = None

    # -- caller audio in ------------------------------------------------------------------------
    def push_input(self, samples: np.ndarray, arrival: float | None = None) -> None:
        """Caller audio, int16 mono 16 kHz, any length; ``arrival`` on the monotonic clock."""
        if self.state is State.CLOSED:
            return
        end_time = self._input_clock.advance(len(samples), self._clock() if arrival is None else arrival)
        frame_len = self.classifier.frame_samples
        audio = np.concatenate([self._pending, samples.astype(np.int16, copy=False)])
        whole = len(audio) - len(audio) % frame_len
        self._pending = audio[whole:]
        pending_s = len(self._pending) / SAMPLE_RATE
        for start in range(0, whole, frame_len):
            frame_end = end_time - pending_s - (whole - start - frame_len) / SAMPLE_RATE
            self._on_frame(audio[start:start + frame_len], frame_end)

    def _on_frame(self, frame: np.ndarray, frame_end: float) -> None:
        frame_ms = self.config.vad.frame_ms
        frame_start_ms = self._stream_ms
        self._stream_ms += frame_ms
        echo = self.echo.is_echo(frame, frame_end)  # always, so the delay estimate stays current
        voiced = self.classifier.is_voiced(frame) and not echo
        self._recent.append(frame)
        if self.detector.speaking:
            self._stream_user_audio(frame)
        event = self.detector.push(frame_start_ms, voiced)
        if isinstance(event, SpeechStarted):
            self._on_speech_started(event.onset_ms)
        elif isinstance(event, SpeechStopped):
            self._on_speech_stopped(event.end_ms)
        elif isinstance(event, SpeechPaused):
            self._speculate(event.end_ms)
        elif isinstance(event, SpeechResumed):
            self._resume(event.at_ms)
        elif self.detector.speaking and self._turn_too_long(frame_start_ms):
            self.detector.reset()
            self._on_speech_stopped(frame_start_ms + frame_ms)

    def _on_speech_started(self, onset_ms: int) -> None:
        onset_time = self._input_clock.time_at(onset_ms)
        if self._response is not None and not self._response.over:
            self._interrupt("turn_detected", onset_time)
        self._user_item = self._new_item_id()
        self._turn_started_ms = onset_ms
        self.emit(ev.SpeechStarted(audio_start_ms=onset_ms, item_id=self._user_item))
        self._turn_count += 1
        self.counters["turns"] += 1
        self._turn_edits, self._pending_edits = self._pending_edits, {}
        turn = self.runtime.start_turn(self._turn_params())
        self._user_turn = turn
        since_onset_ms = self._stream_ms - onset_ms
        frames = (self.config.vad.prefix_padding_ms + since_onset_ms) // self.config.vad.frame_ms
        self._to_feed = list(self._recent)[-max(1, frames):]  # prefix padding + the speech so far
        self._turn_audio = list(self._to_feed)
        self._response = Response(turn, self._new_item_id(), self._user_item, self._clock)
        self._spawn(self._consume(self._response))
        self._set_state(State.USER_SPEAKING)

    def _turn_params(self) -> dict:
        return {"session_id": self.session_id, "turn": self._turn_count,
                "instructions": self.config.instructions, **self._turn_edits}

    def _stream_user_audio(self, frame: np.ndarray) -> None:
        self._turn_audio.append(frame)
        if self._response is not None and self._response.speculative:
            return  # the turn's input is closed; the audio is kept in case the caller resumes
        self._to_feed.append(frame)
        if len(self._to_feed) * self.config.vad.frame_ms >= FEED_MS and self._user_turn is not None:
            self._user_turn.feed(_to_float(self._to_feed))
            self._to_feed = []

    def _on_speech_stopped(self, end_ms: int) -> None:
        turn, response = self._user_turn, self._response
        self._user_turn = None
        if turn is None or response is None or response.over:  # the turn failed while the caller spoke
            self._to_feed, self._turn_audio = [], []
            self._set_state(State.IDLE)
            return
        if not response.speculative:
            turn.feed(_to_float(self._to_feed), eos=True)
        self._to_feed, self._turn_audio = [], []
        self.emit(ev.SpeechStopped(audio_end_ms=end_ms, item_id=response.user_item_id))
        self.emit(ev.InputCommitted(item_id=response.user_item_id))
        self.emit(ev.ItemAdded(item=_user_item(response.user_item_id)))
        self._begin_response(response, speech_end=self._input_clock.time_at(end_ms))
        if response.speculative:
            self._commit_speculation(response)

    # -- preemptive generation ------------------------------------------------------------------
    def _speculate(self, end_ms: int) -> None:
        """The caller paused: close the turn's input so the answer starts now, but hold it."""
        turn, response = self._user_turn, self._response
        if turn is None or response is None or response.over or response.speculative:
            return
        turn.feed(_to_float(self._to_feed), eos=True)
        self._to_feed = []
        response.speculative = True
        self.counters["preemptive_starts"] += 1
        self.emit(ev.PreemptiveStarted(item_id=response.user_item_id or "", request_id=turn.request_id,
                                       audio_end_ms=end_ms))

    def _resume(self, at_ms: int) -> None:
        """The caller spoke again within the silence window: drop the speculative response and
        carry on with a fresh request holding the whole turn so far."""
        old = self._response
        if old is None or not old.speculative or old.over:
            return
        old.cancelled = old.over = True
        old.held = []
        old.turn.abort()  # idempotent: harmless if the runtime already finished it
        self.counters["preemptive_aborts"] += 1
        self._turn_edits.setdefault("supersedes", []).append(old.turn.request_id)
        self.emit(ev.PreemptiveCancelled(item_id=old.user_item_id or "", request_id=old.turn.request_id,
                                         audio_start_ms=at_ms, reason="speech_resumed"))
        turn = self.runtime.start_turn(self._turn_params())
        self._user_turn = turn
        turn.feed(_to_float(self._turn_audio))
        self._to_feed = []
        self._response = Response(turn, self._new_item_id(), old.user_item_id, self._clock)
        self._spawn(self._consume(self._response))

    def _commit_speculation(self, response: Response) -> None:
        """The turn really ended: what the speculative response made so far is released now."""
        response.speculative = False
        held, response.held = response.held, []
        self.counters["preemptive_commits"] += 1
        ready_ms = sum(1000 * o.audio.size / o.sample_rate for o in held
                       if isinstance(o, TurnOutput) and o.audio is not None and o.sample_rate > 0)
        self.emit(ev.PreemptiveCommitted(item_id=response.user_item_id or "", request_id=response.turn.request_id,
                                         response_id=response.id, audio_ready_ms=round(ready_ms)))
        for out in held:
            self._dispatch(response, out)

    def _turn_too_long(self, frame_start_ms: int) -> bool:
        return frame_start_ms - self._turn_started_ms > 1000 * self.config.max_turn_s

    # -- responses ------------------------------------------------------------------------------
    def request_response(self) -> None:
        """A response without new caller audio (client ``response.create``)."""
        if self._response is not None and not self._response.over:
            self.emit_error("conversation_already_has_active_response",
                            "a response is in progress; cancel it first (response.cancel)")
            return
        self._turn_count += 1
        self._turn_edits, self._pending_edits = self._pending_edits, {}
        turn = self.runtime.start_turn(self._turn_params())
        turn.feed(np.zeros(0, np.float32), eos=True)
        response = Response(turn, self._new_item_id(), None, self._clock)
        self._response = response
        self._spawn(self._consume(response))
        self._begin_response(response, speech_end=self._clock())

    def _begin_response(self, response: Response, speech_end: float) -> None:
        response.begin(speech_end)
        self.counters["responses"] += 1
        self.emit(ev.ResponseCreated(response=response.describe("in_progress")))
        self.emit(ev.OutputItemAdded(response_id=response.id, item=response.item("in_progress")))
        self._set_state(State.RESPONDING)

    async def _consume(self, response: Response) -> None:
        try:
            async for out in response.turn.events():
                if response.cancelled:
                    if isinstance(out, TurnEnded):
                        return
                    continue
                self._deliver(response, out)
                if isinstance(out, TurnEnded):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken stream fails this response, never the session
            log.exception("session %s: response stream failed", self.session_id)
            self._deliver(response, TurnEnded(status="failed", error=repr(exc)))

    def _deliver(self, response: Response, out: TurnOutput | TurnEnded) -> None:
        if response.speculative:
            response.held.append(out)
        else:
            self._dispatch(response, out)

    def _dispatch(self, response: Response, out: TurnOutput | TurnEnded) -> None:
        if isinstance(out, TurnEnded):
            self._on_turn_ended(response, out)
        else:
            self._on_output(response, out)

    def _on_output(self, response: Response, out: TurnOutput) -> None:
        if out.user_text and response.user_item_id is not None:
            kind = ev.TranscriptionCompleted if out.user_text_final else ev.TranscriptionDelta
            field = "transcript" if out.user_text_final else "delta"
            self.emit(kind(item_id=response.user_item_id, **{field: out.user_text}))
        if out.audio is not None and out.audio.size and out.sample_rate > 0:
            response.audio_received_ms += 1000 * out.audio.size / out.sample_rate
            if self.playout.item_id != response.item_id and not response.audio_began:
                self.playout.begin_item(response.item_id)
                response.audio_began = True
            if self.playout.item_id == response.item_id:
                self.playout.push(out.audio, out.sample_rate)
        if out.text:
            response.transcript.append(out.text)
            self.emit(ev.AudioTranscriptDelta(response_id=response.id, item_id=response.item_id, delta=out.text))

    def _on_turn_ended(self, response: Response, end: TurnEnded) -> None:
        response.finished = True
        if end.status == "completed":
            self.emit(ev.AudioTranscriptDone(response_id=response.id, item_id=response.item_id,
                                             transcript="".join(response.transcript)))
            if self.playout.item_id == response.item_id:
                self.playout.complete_item()
            self.emit(ev.ResponseDone(response=response.describe("completed")))
            if not response.audio_began:
                self._finish(response)
            return
        self.counters["errors"] += 1
        self.emit_error("response_failed", end.error or f"response {end.status}", kind="server_error")
        if self.playout.item_id == response.item_id:
            self.playout.flush()
        if response.speech_end is None:  # failed while the caller was still speaking: no response yet
            response.over = True
            return
        self.emit(ev.ResponseDone(response=response.describe("failed", {"type": "failed", "error": end.error})))
        self._finish(response)

    def _finish(self, response: Response) -> None:
        response.over = True
        if self.state in (State.RESPONDING, State.AGENT_SPEAKING) and self._response is response:
            self._set_state(State.IDLE)

    def cancel_response(self, reason: str = "client_cancelled", audio_end_ms: int | None = None) -> bool:
        """Client ``response.cancel`` / ``output_audio_buffer.clear`` / ``conversation.item.truncate``;
        False if there is nothing to cancel."""
        if self._response is None or self._response.over or self.state is State.USER_SPEAKING:
            return False
        self._interrupt(reason, None, audio_end_ms)
        self._set_state(State.IDLE)
        return True

    def clear_input(self) -> None:
        """Client ``input_audio_buffer.clear``: drop the turn the caller is speaking, if any."""
        if self._user_turn is not None and self._response is not None:
            self._response.cancelled = self._response.over = True
            self._user_turn.abort()
        self._user_turn = None
        self._to_feed, self._turn_audio = [], []
        self.detector.reset()
        if self.state is State.USER_SPEAKING:
            self._set_state(State.IDLE)

    def reconfigure(self, config: SessionConfig) -> None:
        """Apply new settings (session.update); VAD changes take effect from the next turn."""
        self.config = config
        self.classifier.config = config.vad
        self.classifier.set_aggressiveness(config.vad.aggressiveness)
        if not self.detector.speaking:
            self.detector = TurnDetector(config.vad, config.pause_ms)
        self._recent = deque(self._recent, maxlen=self._recent_frames())

    def _interrupt(self, reason: str, onset_time: float | None, audio_end_ms: int | None = None) -> None:
        """Stop the response now: flush queued audio, abort it everywhere, tell the client."""
        response = self._response
        assert response is not None
        played_ms = self.playout.flush() if self.playout.item_id == response.item_id else response.played_ms
        response.cancelled = response.over = True
        if not response.finished:
            response.turn.abort()
            self.counters["cancelled"] += 1
            self.emit(ev.ResponseDone(response=response.describe("cancelled", {"type": "cancelled", "reason": reason})))
        heard = played_ms if audio_end_ms is None else min(audio_end_ms, played_ms)
        if response.audio_began:
            self.emit(ev.OutputAudioCleared(response_id=response.id))
            self.emit(ev.ItemTruncated(item_id=response.item_id, audio_end_ms=heard))
        if response.speech_end is not None:
            # The next request tells the pipeline what was heard of this one. ``audio_ms`` (all
            # of its audio) is known only if the runtime had finished it; else it is left out.
            self._pending_edits["truncate"] = {
                "request_id": response.turn.request_id, "audio_end_ms": heard if response.audio_began else 0,
                "audio_ms": round(response.audio_received_ms) if response.finished else None}
        if onset_time is not None:
            self.counters["barge_ins"] += 1
            self.last_barge_in_ms = 1000 * (self._clock() - onset_time)
            self.emit(ev.TurnMetrics(response_id=response.id, barge_in_ms=round(self.last_barge_in_ms, 1)))

    # -- agent audio out ------------------------------------------------------------------------
    def pull_output(self, due: float) -> np.ndarray:
        """The next output frame (int16 interleaved, in the output format), due at ``due``."""
        frame = self.playout.pull()
        self._record_reference(frame.pcm, frame.item_id is not None, due)
        response = self._response
        if response is None or frame.item_id != response.item_id:
            return frame.pcm
        if frame.first_of_item:
            response.on_first_audio(due)
            self.last_ttfa_ms = response.ttfa_ms
            self.emit(ev.OutputAudioStarted(response_id=response.id))
            self.emit(ev.TurnMetrics(response_id=response.id, ttfa_ms=response.ttfa_ms))
            if self.state is State.RESPONDING:
                self._set_state(State.AGENT_SPEAKING)
        elif frame.item_drained:
            response.played_ms = self.playout.played_ms
            self.emit(ev.OutputAudioStopped(response_id=response.id))
            self._finish(response)
        return frame.pcm

    def _record_reference(self, pcm: np.ndarray, audible: bool, due: float) -> None:
        fmt = self.playout.format
        end = due + fmt.frame_ms / 1000
        if not audible:
            self.echo.record_output(np.zeros(SAMPLE_RATE * fmt.frame_ms // 1000, np.int16), end)
            return
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=fmt.layout)
        frame.sample_rate = fmt.sample_rate
        chunks = [f.to_ndarray().reshape(-1) for f in self._reference.resample(frame)]
        if chunks:
            self.echo.record_output(np.concatenate(chunks), end)

    # -- lifetime, events -----------------------------------------------------------------------
    async def close(self) -> None:
        if self.state is State.CLOSED:
            return
        if self._response is not None and not self._response.finished:
            self._response.cancelled = self._response.over = True
            self._response.turn.abort()
        self.playout.flush()
        self.state = State.CLOSED
        if self.config.end_of_session_request:
            self._announce_end()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _announce_end(self) -> None:
        """Tell the pipeline this session is over, so per-session state (history, cached KV) goes."""
        try:
            self.runtime.start_turn({"session_id": self.session_id, "session_end": True}).feed(
                np.zeros(0, np.float32), eos=True)
        except RuntimeError as exc:  # the runtime is shutting down: its state goes with it
            log.info("session %s: end not announced: %s", self.session_id, exc)

    def emit(self, event: ev.ServerEvent) -> None:
        self._event_count += 1
        event.event_id = f"event_{self.session_id[-6:]}_{self._event_count}"
        self._send(event)

    def emit_error(self, code: str, message: str, event_id: str | None = None,
                   kind: str = "invalid_request_error") -> None:
        self.emit(ev.ErrorEvent(error={"type": kind, "code": code, "message": message, "event_id": event_id}))

    def stats(self) -> dict:
        return {"state": self.state.value, **self.counters, "echo_gated_frames": self.echo.gated_frames,
                "echo_delay_ms": self.echo.delay_ms, "last_ttfa_ms": self.last_ttfa_ms,
                "last_barge_in_ms": self.last_barge_in_ms, "queued_output_ms": self.playout.queued_ms,
                "request_id": self._response.turn.request_id if self._response and not self._response.over else None}

    def _set_state(self, state: State) -> None:
        if state is not self.state and self.state is not State.CLOSED:
            self.state = state
            self.emit(ev.StateChanged(state=state.value))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_item_id(self) -> str:
        self._item_count += 1
        return f"item_{self.session_id[-6:]}_{self._item_count}"

    def _recent_frames(self) -> int:
        vad = self.config.vad
        return (vad.prefix_padding_ms + vad.start_window_ms) // vad.frame_ms + 1


def _to_float(frames: list[np.ndarray]) -> np.ndarray:
    if not frames:
        return np.zeros(0, np.float32)
    return np.concatenate(frames).astype(np.float32) / 32768.0


def _user_item(item_id: str) -> dict:
    return {"id": item_id, "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}]}

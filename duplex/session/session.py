"""One conversation: caller audio in -> VAD -> turns -> runtime; agent audio out; barge-in.

Its door pushes the caller's audio as it arrives and pulls one output frame per ``frame_ms``; the session decides the
rest, on one asyncio loop, never blocking. What it asks of the call itself (hang up, keypad) is ``call_tools.py``'s.

Two state machines (``states.py``) say where things stand: the call's (idle -> user_speaking -> responding ->
agent_speaking -> idle) and each response's (listening -> [speculative ->] committed -> speaking [<-> paused] ->
draining -> done, or cancelled / failed). Turn cues come from ``turns.TurnDetector``. Speech onset while a response
is live is a barge-in, and ``listen.BargeInListener`` decides it: with ``barge_in.mode: onset`` at once, an
interruption (``interrupted_by``: the output is flushed, the response aborted in every stage, the client told where
its audio was cut, and a new turn begins); with ``listen`` the reply pauses at the onset and the sound and its words
are judged: an interruption goes on as above, a backchannel or a noise resumes the paused reply where it stopped.

Preemptive generation: a pause (``pause_ms``) closes the turn's input and the answer starts, held; voice again aborts
it and a fresh request (``supersedes`` the old) gets the whole turn; the silence completing, or the pause judged the
end (``endpoint.py``), releases it. What the caller heard of a cut reply (``heard.py``) goes with the next request.

One file: the one place that orders what happens in a call (audio in, cues, runtime events, barge-in, audio out);
what it orders lives beside it, and split, the order would be hidden.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict

import msgspec
import numpy as np

from duplex.config.session import SessionConfig
from duplex.runtime.contract import AgentAudio, AgentText, Heard, ToolCallDelta, ToolCallDone, Transcript, TurnRequest
from duplex.session.call_tools import CallTools
from duplex.session.clock import InputFrames
from duplex.session.counters import SessionCounters
from duplex.session.door import AudioClear, Door
from duplex.session.echo import EchoGate
from duplex.session.endpoint import EndOfTurnJudge, TurnEndModel, TurnJudgement
from duplex.session.listen import BargeInListener
from duplex.session.observe import NO_TAP, CallTap, starved
from duplex.session.overlap import OverlapVerdict
from duplex.session.playout import Playout, PulledFrame
from duplex.session.port import TurnEnded, TurnEvent, TurnStatus, VoiceRuntime, announce_session_end
from duplex.session.realtime import events as ev
from duplex.session.realtime.announce import Announcer
from duplex.session.realtime.client_items import ClientItems, ClientTurn
from duplex.session.realtime.tools import SessionTools
from duplex.session.recording import SessionRecording
from duplex.session.reference import OutputReference
from duplex.session.response import Response
from duplex.session.states import CALL_TRANSITIONS, CallState, ResponseState, StateMachine
from duplex.session.tasks import SessionTasks
from duplex.session.turn_audio import TurnAudio
from duplex.session.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetector
from duplex.session.vad import FrameClassifier

log = logging.getLogger("duplex.session")
FEED_MS = 100  # caller audio goes to the runtime in chunks this long while the caller speaks


class VoiceSession:
    def __init__(self, session_id: str, runtime: VoiceRuntime, config: SessionConfig, door: Door,
                 clock: Callable[[], float] = time.monotonic, turn_end: TurnEndModel | None = None) -> None:
        self.session_id = session_id
        self.runtime = runtime
        self.config = config
        self._clock = clock
        self.door = door
        self.tell = Announcer(session_id, door.deliver)
        self._call = StateMachine("call", CallState.IDLE, CALL_TRANSITIONS)
        self.classifier = FrameClassifier(config.vad)
        self.detector = TurnDetector.for_session(config)
        self.echo = EchoGate(config.echo)
        output_format = door.output
        self.playout = Playout(output_format)
        self._reference = OutputReference(output_format, self.echo)
        self._input = InputFrames()
        self._stream_ms = 0  # caller audio classified so far: the stream time Realtime events use
        self.audio = TurnAudio(config.vad)
        self._request = TurnRequest(session_id=session_id)  # the open turn's request
        self._heard: Heard | None = None  # what was heard of the last interrupted reply, for the next turn
        self._turn_count = 0
        self._response: Response | None = None
        self._tasks = SessionTasks(session_id)
        self.listener = BargeInListener(self, runtime, session_id, self._tasks.spawn)  # barge-in that listens
        self.counters = SessionCounters()
        self.last_ttfa_ms: float | None = None
        self.last_barge_in_ms: float | None = None
        self.items = ClientItems(session_id, self.tell.emit, self.classifier)
        self.tools = SessionTools(self.tell, self.items.new_id)  # function calling (tools.py)
        self.calls = self.tools.builtin = CallTools(self, door.control, self._tasks.start)  # hang up, keypad
        self.tap: CallTap = NO_TAP  # the server's watch on this call (metrics, recording); see observe.py
        self.recording = SessionRecording()  # whether it is recorded, and the client's say (recording.py)
        self.judge = EndOfTurnJudge(config.semantic, turn_end, self._tasks.spawn, self._on_judged)
        self.judge.reconfigure(config.semantic, config.semantic_turns)

    @property
    def state(self) -> CallState:
        return self._call.state

    @property
    def response(self) -> Response | None:  # the latest response (live or not)
        return self._response

    # -- what the barge-in listener reads of the session (listen.ListenHost) ------------------
    @property
    def stream_ms(self) -> int:
        return self._stream_ms

    def time_at(self, stream_ms: int) -> float:
        return self._input.clock.time_at(stream_ms)

    def now(self) -> float:
        return self._clock()

    def clear_audio(self, why: AudioClear) -> None:
        self.door.clear_audio(why)

    def interrupted_by(self, verdict: OverlapVerdict, response: Response) -> None:
        """The overlap was an interruption: stop the reply (if it still lives); the caller's turn
        goes on from the onset with all its audio. A verdict at the onset found the detector's
        turn just opened and its audio pending; a judged one had the reply paused (its audio
        stopped then: ``last_barge_in_ms``) and the turn's audio and cues held while judging."""
        judged = not verdict.at_onset
        if response.live:
            self._interrupt("turn_detected", None if judged else self.time_at(verdict.onset_ms))
            if judged:
                self._count_barge_in(response, self.last_barge_in_ms or 0.0)
        if judged:
            self.detector.carry_on(verdict.onset_ms, verdict.sound_end_ms, self._stream_ms)
        self._open_turn(verdict.onset_ms, replay=judged)

    # -- caller audio in ------------------------------------------------------------------------
    def push_input(self, samples: np.ndarray, arrival: float | None = None, position: int | None = None) -> None:
        """Caller audio, int16 mono 16 kHz, any length; ``arrival`` on the monotonic clock;
        ``position``: where it belongs in the stream (16 kHz samples, any origin), if known."""
        if self.state is CallState.CLOSED:
            return
        arrival = self._clock() if arrival is None else arrival
        self.tap.caller_audio(samples, arrival)  # recorded whoever ends the turns
        if self.config.turn_detection == "none":  # the client ends turns (input_audio_buffer.commit)
            self.items.buffer(samples, self.config.max_turn_s)
            return
        for frame, frame_end in self._input.push(samples, arrival, self.classifier.frame_samples, position):
            self._on_frame(frame, frame_end)

    def _on_frame(self, frame: np.ndarray, frame_end: float) -> None:
        frame_start_ms = self._stream_ms
        self._stream_ms += self.config.vad.frame_ms
        echo = self.echo.is_echo(frame, frame_end)  # always, so the delay estimate stays current
        voiced = self.classifier.is_voiced(frame) and not echo
        self.audio.hear(frame, voiced)
        if self.detector.speaking or self.listener.active:
            self._stream_caller_audio(frame, voiced)
        cue = self.detector.push(frame_start_ms, voiced, self._speech_start_ms())
        if self.listener.active:  # the judge decides what this sound is; no other cue counts
            self.listener.listen(voiced)
        elif isinstance(cue, SpeechStarted):
            self._on_speech_started(cue.onset_ms)
        elif isinstance(cue, SpeechStopped):
            self._on_speech_stopped(cue.end_ms)
        elif isinstance(cue, SpeechPaused):
            self._on_pause(cue)
        elif isinstance(cue, SpeechResumed):
            self.judge.forget()
            self._resume(cue.at_ms)

    def _speech_start_ms(self) -> int:
        """Voiced audio that starts speech now: less while a reply that would only pause is live."""
        vad, barge_in, response = self.config.vad, self.config.barge_in, self._response
        if barge_in.mode == "listen" and response is not None and response.live:
            return min(vad.min_speech_ms, barge_in.pause_speech_ms)
        return vad.min_speech_ms

    def _on_speech_started(self, onset_ms: int) -> None:
        since_onset_ms = self._stream_ms - onset_ms
        self.audio.open((self.config.vad.prefix_padding_ms + since_onset_ms) // self.config.vad.frame_ms)
        response = self._response
        if response is not None and response.live:
            self.listener.barge_in(response, onset_ms)
            return
        self._open_turn(onset_ms)

    def _open_turn(self, onset_ms: int, replay: bool = False) -> None:
        """The caller's turn starts (its audio is open); ``replay``: feed it all heard so far."""
        self.tools.fence()  # a call still waiting for its result is not answered aloud any more
        user_item = self.items.new_id()
        self.tell.speech_started(user_item, onset_ms)
        self.judge.new_turn()
        self.counters.turns += 1
        self._request = self._next_request()
        response = self._start(self._request, user_item)
        if replay:
            response.turn.feed(self.audio.replay())
        self._move_call(CallState.USER_SPEAKING)

    def _next_request(self) -> TurnRequest:
        """A new turn's request; it carries what was heard of the reply it follows."""
        self._turn_count += 1
        heard, self._heard = self._heard, None
        return self.tools.attach(TurnRequest(session_id=self.session_id, turn=self._turn_count, heard=heard,
                                             instructions=self.config.instructions, voice=self.config.voice,
                                             output_audio=self.items.output_audio))

    def _stream_caller_audio(self, frame: np.ndarray, voiced: bool) -> None:
        response = self._response
        open_turn = response if response is not None and response.input_open else None
        self.audio.add(frame, voiced, feed=open_turn is not None or self.listener.hearing)
        if open_turn is not None and self.audio.pending_ms >= FEED_MS:
            open_turn.turn.feed(self.audio.take_pending())
        elif self.listener.hearing and self.audio.pending_ms >= FEED_MS:
            self.listener.feed(self.audio.take_pending())

    def _on_speech_stopped(self, end_ms: int) -> None:
        self.judge.forget()
        response = self._response
        if response is None or response.state not in (ResponseState.LISTENING, ResponseState.SPECULATIVE):
            self.audio.close()  # the turn's request failed while the caller spoke: no response
            self._move_call(CallState.IDLE)
            return
        speculative = response.speculative
        if not speculative:
            response.turn.feed(self.audio.take_pending(), eos=True)
        self.audio.close()
        self.tell.turn_committed(response.user_item_id or "", end_ms)
        held = self._commit(response, speech_end=self._input.clock.time_at(end_ms))
        if speculative:
            self.counters.preemptive_commits += 1
            ready_ms = sum(1000 * e.seconds for e in held if isinstance(e, AgentAudio))
            self.tell.speculation_committed(response, round(ready_ms))
        for event in held:
            if not response.live:
                break  # a held failure ended it
            self._apply(response, event)

    # -- preemptive generation, semantic turns --------------------------------------------------
    def _on_pause(self, cue: SpeechPaused) -> None:
        if cue.speculate:  # pauses are reported only to speculate on and (semantic turns) to judge
            self._speculate(cue.end_ms)
        if cue.judge and self.config.semantic_turns:
            self.judge.judge(cue.end_ms, self.audio.turn_samples())

    def _on_judged(self, judgement: TurnJudgement) -> None:
        response = self._response
        if response is None or response.user_item_id is None or not response.speculative:
            return  # the turn is over already
        self.tell.turn_judged(response.user_item_id, judgement)
        stop = self.detector.end_now(judgement.pause_end_ms) if judgement.complete else None
        if stop is not None:
            self.counters.judged_complete += 1
            self._on_speech_stopped(stop.end_ms)
        elif not judgement.complete:
            self.counters.judged_incomplete += 1

    def _speculate(self, end_ms: int) -> None:
        """The caller paused: close the turn's input so the answer starts now, but hold it."""
        response = self._response
        if response is None or not response.input_open:
            return
        response.turn.feed(self.audio.take_pending(), eos=True)
        response.move(ResponseState.SPECULATIVE)
        self.counters.preemptive_starts += 1
        self.tell.speculation_started(response, end_ms)

    def _resume(self, at_ms: int) -> None:
        """The caller spoke again within the silence window: drop the speculative response and
        carry on with a fresh request holding the whole turn so far."""
        old = self._response
        if old is None or not old.speculative:
            return
        old.move(ResponseState.CANCELLED)
        old.turn.abort()  # idempotent: harmless if the runtime already finished it
        self.counters.preemptive_aborts += 1
        self._request = msgspec.structs.replace(self._request, supersedes=[*self._request.supersedes,
                                                                           old.turn.request_id])
        self.tell.speculation_cancelled(old, at_ms)
        self._start(self._request, old.user_item_id).turn.feed(self.audio.replay())

    # -- responses ------------------------------------------------------------------------------
    def request_response(self, client: ClientTurn | None = None) -> None:
        """A response without new caller speech (client ``response.create``): to the items the
        client added (``client``: typed text or a clip), or to the conversation so far."""
        if self.state is CallState.CLOSED:
            return
        if self._response is not None and self._response.live:
            self.tell.error("conversation_already_has_active_response",
                            "a response is in progress; cancel it first (response.cancel)")
            return
        if self.state is CallState.USER_SPEAKING:
            self.tell.error("conversation_already_has_active_response",
                            "the caller is speaking; the end of their turn starts a response")
            return
        client = client or ClientTurn()
        request = msgspec.structs.replace(self._next_request(), text=client.text, output_audio=client.output_audio)
        if client.instructions is not None:
            request = msgspec.structs.replace(request, instructions=client.instructions)
        response = self._start(request, client.user_item_id)
        response.typed = client.text is not None
        response.turn.feed(client.audio or self.audio.empty(), eos=True)
        self._commit(response, speech_end=self._clock())

    def _start(self, request: TurnRequest, user_item_id: str | None) -> Response:
        response = Response(self.runtime.start(request), self.items.new_id(), user_item_id)
        response.text_only = not request.output_audio
        self._response = response
        self._tasks.spawn(response.consume(self._deliver))
        return response

    def _commit(self, response: Response, speech_end: float) -> list[TurnEvent]:
        """Announce the response; returns what it held until now."""
        held = response.commit(speech_end, self._clock())
        self.counters.responses += 1
        self.tell.response_created(response)
        self._move_call(CallState.RESPONDING)
        return held

    def _deliver(self, response: Response, event: TurnEvent) -> None:
        response.timing.saw(event, self._clock())  # when it arrived, held back or not
        if isinstance(event, Transcript) and response is self._response:
            self.judge.heard(event.text, event.final)  # held or not: the judge reads the turn's words
        if response.holds(event):
            response.held.append(event)
        else:
            self._apply(response, event)

    def _apply(self, response: Response, event: TurnEvent) -> None:
        if isinstance(event, TurnEnded):
            self._on_turn_ended(response, event)
        elif isinstance(event, Transcript):
            if event.text and response.user_item_id is not None and not response.typed:
                self.tell.user_transcript(response.user_item_id, event)
            response.input_words = len(event.text.split())
        elif isinstance(event, AgentText):
            if event.text:
                response.transcript.append(event.text)
                self.tell.agent_text(response, event.text)
        elif isinstance(event, AgentAudio):
            self._on_agent_audio(response, event)
        elif isinstance(event, (ToolCallDelta, ToolCallDone)):
            self.tools.on_call(response, event)
        # other payloads (a family's own) are not the client's business

    def _on_agent_audio(self, response: Response, audio: AgentAudio) -> None:
        if len(audio.samples) == 0 or audio.sample_rate <= 0 or response.text_only:
            return
        response.audio_received_ms += 1000 * audio.seconds
        response.voiced.add(1000 * audio.seconds, audio.text)
        if response.state is ResponseState.COMMITTED:  # its first audio
            self.playout.begin_item(response.item_id)
            response.move(ResponseState.SPEAKING)
        if self.playout.item_id == response.item_id:
            self.playout.push(np.asarray(audio.samples, np.float32), audio.sample_rate)

    def _on_turn_ended(self, response: Response, end: TurnEnded) -> None:
        if end.status is TurnStatus.COMPLETED:
            if response.audio_began:
                self.playout.complete_item()
            response.complete()
            self.tell.response_completed(response)
            if not response.live:
                self._end_of_response(response)
            return
        self.counters.errors += 1
        message = str(end.error) if end.error else f"response {end.status.value}"
        self.tell.error("response_failed", message, kind="server_error")
        if self.playout.item_id == response.item_id:
            self.playout.flush()
        announced = response.committed
        response.move(ResponseState.FAILED)
        if announced:  # else it failed while the caller was still speaking: no response yet
            self.tell.response_failed(response, str(end.error) if end.error else None)
            self._end_of_response(response)

    def _end_of_response(self, response: Response) -> None:
        if self._response is response and self.state in (CallState.RESPONDING, CallState.AGENT_SPEAKING):
            self._move_call(CallState.IDLE)
        self.calls.reply_over()  # an end_call or keypad digits waiting for the reply to be over

    def cancel_response(self, reason: str = "client_cancelled", audio_end_ms: int | None = None) -> bool:
        """Client ``response.cancel`` / ``output_audio_buffer.clear`` / ``conversation.item.truncate``;
        False if there is nothing to cancel."""
        response = self._response
        if response is None or not response.live or not response.committed:
            return False
        self._interrupt(reason, None, audio_end_ms)
        self._move_call(CallState.IDLE)
        return True

    def clear_input(self) -> None:
        """Client ``input_audio_buffer.clear``: drop the turn the caller is speaking, if any."""
        response = self._response
        if response is not None and response.state in (ResponseState.LISTENING, ResponseState.SPECULATIVE):
            response.move(ResponseState.CANCELLED)
            response.turn.abort()
        self.audio.close()
        self.detector.reset()
        self.listener.drop()  # nothing to judge any more: a paused reply plays on
        if self.state is CallState.USER_SPEAKING:
            self._move_call(CallState.IDLE)

    def reconfigure(self, config: SessionConfig) -> None:
        """Apply new settings (session.update); VAD changes take effect from the next turn."""
        self.config = config
        self.classifier.config = config.vad
        self.classifier.set_aggressiveness(config.vad.aggressiveness)
        if not self.detector.speaking:
            self.detector = TurnDetector.for_session(config)
        self.judge.reconfigure(config.semantic, config.semantic_turns)
        self.audio.reconfigure(config.vad)

    def _interrupt(self, reason: str, onset_time: float | None, audio_end_ms: int | None = None) -> None:
        """Stop the live, announced response now: flush queued audio, abort it everywhere, tell
        the client, and keep what was heard of it for the next request."""
        response = self._response
        assert response is not None and response.committed
        played_ms = self.playout.flush() if self.playout.item_id == response.item_id else response.played_ms
        audio_began, runtime_ended = response.audio_began, response.runtime_ended
        response.move(ResponseState.CANCELLED)
        if not runtime_ended:
            response.turn.abort()
            self.counters.cancelled += 1
            self.tell.response_cancelled(response, reason)
        heard = played_ms if audio_end_ms is None else min(audio_end_ms, played_ms)
        heard_ms = heard if audio_began else 0
        text = response.voiced.heard(heard_ms)
        if audio_began:
            self.clear_audio(AudioClear.CUT)  # before the events: the door ends its audio item first
            self.tell.audio_cut(response, heard, text)
        # ``audio_ms`` (all of its audio) is known only if the runtime had finished it
        self._heard = Heard(request_id=response.turn.request_id, audio_end_ms=heard_ms, text=text,
                            audio_ms=round(response.audio_received_ms) if runtime_ended else None)
        if onset_time is not None:
            self._count_barge_in(response, 1000 * (self._clock() - onset_time))

    def _count_barge_in(self, response: Response, stop_ms: float) -> None:
        """``stop_ms``: from the caller's onset until the agent's audio stopped."""
        self.counters.barge_ins += 1
        self.last_barge_in_ms = stop_ms
        self.tell.barge_in(response, stop_ms)

    # -- agent audio out ------------------------------------------------------------------------
    def pull_output(self, due: float) -> np.ndarray:
        """The next output frame (int16 interleaved, in the output format), due at ``due``."""
        return self.pull_frame(due).pcm

    def pull_frame(self, due: float) -> PulledFrame:
        """``pull_output``, saying which response item the frame's audio belongs to."""
        frame = self.playout.pull()
        self._reference.played(frame.pcm, frame.item_id is not None, due)
        response = self._response
        self.tap.agent_frame(frame.pcm, due, self._clock() - due, starved(response, frame))
        if response is None or frame.item_id != response.item_id:
            return frame
        if frame.first_of_item:
            response.on_first_audio(due)
            self.last_ttfa_ms = response.ttfa_ms
            self.tell.audio_started(response)
            if self.state is CallState.RESPONDING:
                self._move_call(CallState.AGENT_SPEAKING)
        elif frame.item_drained:
            response.played_ms = self.playout.played_ms
            self.tell.audio_stopped(response)
            response.move(ResponseState.DONE)
            self._end_of_response(response)
        return frame

    # -- lifetime, events -----------------------------------------------------------------------
    async def close(self) -> None:
        if self.state is CallState.CLOSED:
            return
        response = self._response
        if response is not None and response.live:
            if not response.runtime_ended:
                response.turn.abort()
            response.move(ResponseState.CANCELLED)
        self.playout.flush()
        self.listener.stop()
        self._call.move(CallState.CLOSED)  # no event: the client is going away
        if self.config.end_of_session_request:
            announce_session_end(self.runtime, self.session_id)
        await self._tasks.cancel_all()

    def emit(self, event: ev.ServerEvent) -> None:  # the edges' and the protocol's way to speak for the session
        self.tell.emit(event)

    def emit_error(self, code: str, message: str, event_id: str | None = None,
                   kind: str = "invalid_request_error") -> None:
        self.tell.error(code, message, event_id, kind)

    def stats(self) -> dict:
        live = self._response is not None and self._response.live
        return {"state": self.state.value, **asdict(self.counters), "echo_gated_frames": self.echo.gated_frames,
                "echo_delay_ms": self.echo.delay_ms, "last_ttfa_ms": self.last_ttfa_ms,
                "last_barge_in_ms": self.last_barge_in_ms, "queued_output_ms": self.playout.queued_ms,
                "request_id": self._response.turn.request_id if live and self._response else None}

    def _move_call(self, state: CallState) -> None:
        self._call.move(state)
        self.tell.state(state.value)

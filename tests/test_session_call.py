"""A VoiceSession in process, frame by frame, against a scripted runtime and a fake clock: a turn,
barge-in, client cancel and truncate, preemption, stage failure, echo, response.create, hang-up.

Caller speech is the toy voice's syllables (deterministic, and voiced to webrtcvad); every
expected number is derived from the frame size, the session's settings and its own events.
"""

from __future__ import annotations

import json

import pytest

from duplex.config.session import EchoConfig, SessionConfig
from duplex.runtime.contract import SESSION_RATE, Heard, SessionEnd, TurnRequest
from duplex.session.protocol import handle_client_message
from duplex.session.realtime import events as ev
from duplex.session.session import FEED_MS
from tests.session_fakes import ARRIVAL_LAG_S, CLOCK_START, FRAME_MS, Call, words

PREFIX_MS = SessionConfig().vad.prefix_padding_ms
SILENCE_MS = SessionConfig().vad.silence_ms
QUESTION = "could you tell me what time it is"


async def ask(call: Call, text: str = QUESTION) -> None:
    """Lead-in silence (longer than the prefix padding), the words, then the end-of-turn silence."""
    await call.quiet(PREFIX_MS + 200)
    await call.say(words(text))
    await call.quiet(SILENCE_MS + 4 * FRAME_MS)


async def play_until_idle(call: Call, limit_ms: int = 10_000) -> None:
    for _ in range(limit_ms // FRAME_MS):
        if call.session.state.value == "idle":
            return
        await call.quiet(FRAME_MS)
    raise AssertionError(f"still {call.session.state.value} after {limit_ms} ms: {call.types()}")


async def answering(call: Call, *reply: str, complete: bool = True, play_ms: int = 200) -> float:
    """Ask, script the reply, let ``play_ms`` of it play; returns the reply's audio seconds."""
    await ask(call)
    seconds = call.runtime.last.say(*reply)
    if complete:
        call.runtime.last.complete()
    await call.quiet(play_ms)
    return seconds


async def test_a_turn_streams_its_audio_with_the_vad_verdicts_and_its_answer_plays():
    call = Call()
    await call.quiet(PREFIX_MS + 200)
    await call.say(words(QUESTION))
    turn = call.runtime.last
    turn.transcript("could you", final=False)  # interim transcripts pass while the caller speaks
    await call.quiet(SILENCE_MS + 4 * FRAME_MS)

    started, stopped = call.of_type(ev.SpeechStarted)[0], call.of_type(ev.SpeechStopped)[0]
    assert turn.request == TurnRequest(session_id="sess_fake01", turn=1)
    # prefix padding + onset .. the frame where the end-of-turn silence completed, in FEED_MS chunks
    assert turn.eos and turn.fed_ms == PREFIX_MS + (stopped.audio_end_ms + SILENCE_MS - started.audio_start_ms)
    assert all(1000 * len(a.samples) // SESSION_RATE >= FEED_MS for a in turn.fed[:-1])
    assert len(turn.voiced) * FRAME_MS == turn.fed_ms and all(a.frame_ms == FRAME_MS for a in turn.fed)
    lead = PREFIX_MS // FRAME_MS
    assert not any(turn.voiced[:lead]) and turn.voiced[lead]  # the padding is silence, the onset voiced
    assert [e.delta for e in call.of_type(ev.TranscriptionDelta)] == ["could you"]

    seconds = turn.say("it", "is", "noon")
    turn.complete()
    await play_until_idle(call)
    assert call.types()[-10:] == [
        "response.output_audio_transcript.delta", "response.output_audio_transcript.delta",
        "response.output_audio_transcript.delta", "response.output_audio_transcript.done", "response.done",
        "output_audio_buffer.started", "duplex.metrics", "duplex.state", "output_audio_buffer.stopped", "duplex.state"]
    done = call.of_type(ev.ResponseDone)[0].response
    assert done.status == "completed" and done.output[0].content[0].transcript == "it is noon"
    assert call.states() == ["user_speaking", "responding", "agent_speaking", "idle"]
    loud = call.loud_frames()
    assert len(loud) == pytest.approx(1000 * seconds / FRAME_MS, abs=1)  # all of it played, once
    # time to first audio: the first loud frame's due time - the end of the caller's speech
    speech_end = CLOCK_START + ARRIVAL_LAG_S + stopped.audio_end_ms / 1000  # the input clock's anchor + stream time
    first_due = CLOCK_START + loud[0] * FRAME_MS / 1000
    assert call.session.last_ttfa_ms == round(1000 * (first_due - speech_end), 1)


ONSET = SessionConfig.model_validate({"barge_in": {"mode": "onset"}})  # any onset interrupts at once


async def test_barge_in_flushes_at_once_aborts_and_the_next_request_carries_what_was_heard():
    call = Call(ONSET)
    await answering(call, "this", "is", "a", "long", "answer", "to", "your", "question", complete=False)
    first = call.runtime.last
    assert call.loud_frames() and call.session.state.value == "agent_speaking"

    await call.say(words("wait"))
    await call.quiet(SILENCE_MS)
    # the flush is at once: the agent spoke up to the frame in which the onset was detected, and
    # no frame pulled after it has any of its audio
    detected = call.frame_of(call.of_type(ev.SpeechStarted)[1])
    assert detected - 1 in call.loud_frames() and all(i < detected for i in call.loud_frames())
    assert first.aborted
    done = call.of_type(ev.ResponseDone)[0].response
    assert (done.status, done.status_details.type, done.status_details.reason) == ("cancelled", "cancelled",
                                                                                   "turn_detected")
    truncated = call.of_type(ev.ItemTruncated)[0]
    assert truncated.audio_end_ms == detected * FRAME_MS - call.loud_frames()[0] * FRAME_MS  # what was pulled
    assert call.of_type(ev.OutputAudioCleared)
    second = call.runtime.last
    assert second.request.heard == Heard(request_id=first.request_id, audio_end_ms=truncated.audio_end_ms,
                                         text=truncated.transcript)
    stats = call.session.stats()
    assert (stats["barge_ins"], stats["cancelled"]) == (1, 1)
    # the stop is measured from the onset to the flush: within the VAD's start window
    assert 0 < call.session.last_barge_in_ms <= SessionConfig().vad.start_window_ms + FRAME_MS


async def test_barge_in_over_a_finished_reply_truncates_without_aborting():
    call = Call(ONSET)
    seconds = await answering(call, "this", "is", "a", "long", "answer", "to", "your", "question")
    first = call.runtime.last
    await call.say(words("wait"))
    assert not first.aborted  # the runtime had finished it: nothing to abort
    assert [d.response.status for d in call.of_type(ev.ResponseDone)] == ["completed"]
    truncated = call.of_type(ev.ItemTruncated)[0]
    assert call.runtime.last.request.heard == Heard(first.request_id, truncated.audio_end_ms,
                                                    audio_ms=round(1000 * seconds), text=truncated.transcript)


async def test_client_cancel_stops_the_audio_and_tells_the_client():
    call = Call()
    await answering(call, "one", "two", "three", "four", complete=False)
    played = len(call.loud_frames())
    assert call.session.cancel_response() is True
    await call.quiet(200)
    assert len(call.loud_frames()) == played and call.runtime.last.aborted
    done = call.of_type(ev.ResponseDone)[0].response
    assert done.status_details.reason == "client_cancelled"
    assert call.session.state.value == "idle" and call.session.cancel_response() is False
    handle_client_message(call.session, '{"type": "response.cancel", "event_id": "c1"}', "toy")
    error = call.of_type(ev.ErrorEvent)[-1].error
    assert (error.code, error.event_id) == ("response_cancel_not_active", "c1")


async def test_truncate_cuts_at_the_clients_point_when_it_heard_less():
    call = Call()
    await answering(call, "one", "two", "three", "four", complete=False)
    item_id = call.session.playout.item_id
    handle_client_message(call.session, json.dumps({"type": "conversation.item.truncate", "item_id": "item_nope",
                                                    "audio_end_ms": 10}), "toy")
    assert call.of_type(ev.ErrorEvent)[-1].error.code == "item_not_playing"
    played_ms = len(call.loud_frames()) * FRAME_MS
    handle_client_message(call.session, json.dumps({"type": "conversation.item.truncate", "item_id": item_id,
                                                    "audio_end_ms": played_ms - 60}), "toy")
    assert call.of_type(ev.ItemTruncated)[0].audio_end_ms == played_ms - 60
    assert call.of_type(ev.ResponseDone)[0].response.status_details.reason == "client_truncated"
    await ask(call, "next")
    assert call.runtime.last.request.heard.audio_end_ms == played_ms - 60


async def test_a_pause_speculates_voice_again_supersedes_and_the_end_of_turn_releases_the_answer():
    config = SessionConfig.model_validate({"preemptive_generation": {"enabled": True}})
    pause_ms = config.preemptive_generation.pause_ms
    call = Call(config)
    await call.quiet(PREFIX_MS + 200)
    await call.say(words("could you tell me"))
    await call.quiet(pause_ms + 5 * FRAME_MS)  # a pause: over pause_ms, under the end-of-turn silence
    speculation = call.runtime.last
    speculation.transcript("could you tell me")  # never shown: the caller speaks past it
    await call.say(words("what time it is"))
    await call.quiet(pause_ms + FRAME_MS)
    final = call.runtime.last
    seconds = final.say("it", "is", "noon")
    final.complete()
    await call.quiet(FRAME_MS)
    # the answer is ready and held: nothing announced, nothing played while the turn may go on
    assert not call.loud_frames() and not call.of_type(ev.ResponseCreated)
    await play_until_idle(call)

    onset = call.of_type(ev.SpeechStarted)[0].audio_start_ms
    started = call.of_type(ev.PreemptiveStarted)
    assert [s.request_id for s in started] == [speculation.request_id, final.request_id]
    assert speculation.aborted and speculation.fed_ms == PREFIX_MS + started[0].audio_end_ms + pause_ms - onset
    # one request answers it all: the whole turn, replayed with the same VAD verdicts
    assert final.request.supersedes == [speculation.request_id]
    assert final.fed_ms == PREFIX_MS + started[1].audio_end_ms + pause_ms - onset
    assert final.voiced[:len(speculation.voiced)] == speculation.voiced
    assert [c.request_id for c in call.of_type(ev.PreemptiveCancelled)] == [speculation.request_id]
    committed = call.of_type(ev.PreemptiveCommitted)[0]
    assert committed.audio_ready_ms == round(1000 * seconds)
    assert not call.of_type(ev.TranscriptionCompleted)
    # released at once: the first frame pulled after the turn ended is the answer's
    stopped_at = call.events.index(call.of_type(ev.SpeechStopped)[0])
    assert call.types()[stopped_at:stopped_at + 6] == [
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added",
        "response.created", "response.output_item.added", "duplex.state"]
    stats = call.session.stats()
    assert (stats["preemptive_starts"], stats["preemptive_aborts"], stats["preemptive_commits"]) == (2, 1, 1)
    assert stats["responses"] == 1 and len(call.loud_frames()) == pytest.approx(1000 * seconds / FRAME_MS, abs=1)


async def test_a_stage_failure_is_an_error_event_and_the_session_goes_on():
    call = Call()
    await answering(call, "one", "two", "three", complete=False)
    call.runtime.last.fail("the mind broke")
    await call.quiet(100)
    error = call.of_type(ev.ErrorEvent)[0].error
    assert (error.type, error.code) == ("server_error", "response_failed") and "the mind broke" in error.message
    done = call.of_type(ev.ResponseDone)[0].response
    assert done.status == "failed" and "the mind broke" in done.status_details.error
    assert call.session.state.value == "idle"
    loud = len(call.loud_frames())
    await call.quiet(200)
    assert len(call.loud_frames()) == loud  # its queued audio went with it

    await ask(call, "again")
    call.runtime.last.say("fine")
    call.runtime.last.complete()
    await play_until_idle(call)
    assert [d.response.status for d in call.of_type(ev.ResponseDone)] == ["failed", "completed"]
    assert call.runtime.last.request.heard is None and call.session.stats()["errors"] == 1


async def test_a_broken_stream_fails_the_response_not_the_session():
    call = Call()
    await answering(call, "one", "two", complete=False)
    call.runtime.last.break_stream("runtime connection lost")
    await call.quiet(100)
    error = call.of_type(ev.ErrorEvent)[0].error
    assert error.code == "response_failed" and "runtime connection lost" in error.message
    assert call.of_type(ev.ResponseDone)[0].response.status == "failed" and call.session.state.value == "idle"
    await ask(call, "again")
    assert len(call.runtime.turns) == 2 and call.of_type(ev.ResponseCreated)[-1].response.status == "in_progress"


async def test_a_failure_while_the_caller_speaks_announces_no_response():
    call = Call()
    await call.quiet(PREFIX_MS + 200)
    await call.say(words("could you"))
    call.runtime.last.fail("no slot")
    await call.say(words("tell me"))
    await call.quiet(SILENCE_MS + FRAME_MS)
    assert call.of_type(ev.ErrorEvent) and not call.of_type(ev.ResponseCreated)
    assert not call.of_type(ev.SpeechStopped)
    assert call.states() == ["user_speaking", "idle"]


@pytest.mark.parametrize("gate", [True, False])
async def test_the_agents_own_voice_coming_back_does_not_barge_in(gate):
    call = Call(ONSET.model_copy(update={"echo": EchoConfig(enabled=gate)}), echo_gain=0.3, echo_delay_ms=137)
    reply = ["this", "is", "the", "toy", "voice", "answering", "your", "question", "at", "some", "length", "so", "you",
             "can", "hear", "it"]
    seconds = await answering(call, *reply, play_ms=0)
    await call.quiet(round(1000 * seconds) + SILENCE_MS)
    barged = len(call.of_type(ev.SpeechStarted)) > 1
    if gate:
        assert not barged and call.session.echo.gated_frames > 0
        assert [d.response.status for d in call.of_type(ev.ResponseDone)] == ["completed"]
    else:  # the same echo is loud enough to interrupt: the gate is what keeps it out
        assert barged


async def test_response_create_answers_without_audio_and_refuses_a_second():
    call = Call()
    call.session.request_response()
    turn = call.runtime.last
    assert turn.eos and turn.fed_samples == 0
    call.session.request_response()
    assert call.of_type(ev.ErrorEvent)[0].error.code == "conversation_already_has_active_response"
    turn.say("hello")
    turn.complete()
    await play_until_idle(call)
    assert len(call.runtime.turns) == 1 and call.of_type(ev.ResponseDone)[0].response.status == "completed"


async def test_clearing_the_input_drops_the_turn_and_hanging_up_ends_the_session():
    call = Call(SessionConfig(end_of_session_request=True))
    await call.quiet(PREFIX_MS + 200)
    await call.say(words("could you"))
    call.session.clear_input()
    assert call.runtime.last.aborted and call.session.state.value == "idle"
    await call.quiet(SILENCE_MS + FRAME_MS)
    assert not call.of_type(ev.ResponseCreated)

    await answering(call, "one", "two", complete=False)
    answer = call.runtime.last
    await call.session.close()
    assert answer.aborted and call.session.state.value == "closed"
    assert call.runtime.last.request == SessionEnd(session_id="sess_fake01") and call.runtime.last.eos
    await call.quiet(FRAME_MS)  # a closed session ignores audio
    assert call.session.state.value == "closed"


async def test_a_turn_longer_than_the_maximum_is_committed_at_the_maximum():
    call = Call(SessionConfig(max_turn_s=1.0))
    await call.quiet(PREFIX_MS + 200)
    await call.say(words("could you tell me what time it is please"))  # about 2 s of speech
    started, stopped = call.of_type(ev.SpeechStarted)[0], call.of_type(ev.SpeechStopped)[0]
    # cut on the first frame that starts past the maximum; that frame is the turn's last
    assert stopped.audio_end_ms == started.audio_start_ms + 1000 + 2 * FRAME_MS
    assert call.runtime.turns[0].eos and call.of_type(ev.ResponseCreated)

"""The Realtime WebSocket door end to end: the official ``openai`` SDK (its own typed events)
against a real `duplex serve --config toy-voice` with an API key.

Speech is made at test time with espeak-ng and streamed as base64 PCM 24 kHz in real time
(``WsCaller``'s microphone: one 20 ms frame per 20 ms, silence between clips); the server's VAD
ends each turn. Tolerances are whole 20 ms frames."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import numpy as np
import pytest

from duplex.edge.media import g711
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.ws_client import RATE, WsCaller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "sk-test-realtime-0123456789"
FRAME_MS = 20
MAX_FRAME = 256 * 1024


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "4", "--api-key", KEY,
                        "--ice-loopback", "--ws-max-frame-bytes", str(MAX_FRAME)]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


@pytest.fixture(scope="module")
def order() -> np.ndarray:
    return espeak("I would like a large milk tea with pearls please", rate=RATE)


@pytest.fixture(scope="module")
def interruption() -> np.ndarray:
    return espeak("Wait, stop", rate=RATE)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


async def stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        reply = await http.get("/duplex/stats")
        assert reply.status_code == 200, reply.text
        return reply.json()


async def wait_idle(url: str, timeout: float = 10.0) -> dict:
    """Every stage holds nothing (polling /duplex/stats, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        current = await stats(url)
        if all(v["live_requests"] == 0 and not any(v["resources"].values()) for v in current["stages"].values()):
            return current
        assert time.monotonic() < deadline, f"stages still hold state: {current['stages']}"
        await asyncio.sleep(0.05)


def frames_ms(samples: np.ndarray, rate: int = RATE) -> float:
    return 1000 * len(samples) / rate


async def test_a_spoken_order_gets_a_spoken_reply_over_the_sdk(server, order):
    async with WsCaller(server.url, KEY) as caller:
        created = caller.of_type("session.created")[0]
        assert created.session.audio.input.format.type == "audio/pcm"
        assert created.session.audio.input.format.rate == RATE
        await caller.conn.session.update(session={"type": "realtime", "instructions": "Be brief.", "audio": {
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})
        updated = await caller.wait("session.updated")
        assert updated.session.audio.input.turn_detection.silence_duration_ms == 500
        clip = caller.say(np.concatenate([order, silence(1.0)]))
        await caller.wait("input_audio_buffer.speech_started")
        stopped = await caller.wait("input_audio_buffer.speech_stopped", timeout=30)
        committed = await caller.wait("input_audio_buffer.committed")
        assert committed.item_id == stopped.item_id
        transcript = await caller.wait("conversation.item.input_audio_transcription.completed")
        assert "s of speech" in transcript.transcript  # the toy's "ASR": a measurement of the utterance
        response = (await caller.wait("response.created")).response
        done = await _response_done(caller, response.id, timeout=60)
        assert done.response.status == "completed", done
        audio = caller.audio_of(response.id)
        # The spoken order ended, then the 500 ms of silence ended the turn: it was sent by then.
        assert clip.onset_sent is not None and caller.first_audio_at(response.id) > clip.onset_sent
        assert np.sqrt(np.mean(audio ** 2)) > 0.01, "the reply's audio is silent"
        said = "".join(e.delta for e in caller.of_type("response.output_audio_transcript.delta")
                       if e.response_id == response.id)
        assert said.strip()
        finished = [e for e in caller.of_type("response.output_audio_transcript.done") if e.response_id == response.id]
        assert finished and finished[0].transcript == said
        # response.output_audio.done comes after the last delta and before response.done
        audio_done = [e for e in caller.of_type("response.output_audio.done") if e.response_id == response.id]
        assert audio_done and caller.time_of(audio_done[0]) <= caller.time_of(done)
        last_delta = max(c.at for c in caller.audio if c.response_id == response.id)
        assert last_delta <= caller.time_of(audio_done[0])
        # usage counts 20 ms frames of agent audio; the deltas are those frames (the resampler's
        # tail may add or hold back one)
        usage = done.response.usage
        assert abs(usage.output_token_details.audio_tokens - frames_ms(audio) / FRAME_MS) <= 2
        assert usage.output_token_details.text_tokens == len(said.split())
        await wait_idle(server.url)


async def _response_done(caller: WsCaller, response_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        for event in caller.of_type("response.done"):
            if event.response.id == response_id:
                return event
        await caller.wait("response.done", timeout=max(0.01, deadline - time.monotonic()), after=time.monotonic())


async def test_speech_over_the_reply_cancels_it_and_frees_every_stage(server, order, interruption):
    async with WsCaller(server.url, KEY) as caller:
        caller.say(np.concatenate([order, silence(1.0)]))
        response = (await caller.wait("response.created", timeout=30)).response
        await caller.wait("response.output_audio.delta", timeout=30, response_id=response.id)
        while frames_ms(caller.audio_of(response.id)) < 600:  # 0.6 s of the reply heard
            await caller.wait("response.output_audio.delta", after=time.monotonic(), response_id=response.id)
        clip = caller.say(interruption)
        done = await _response_done(caller, response.id, timeout=20)
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
        truncated = await caller.wait("conversation.item.truncated", timeout=10)
        sent_ms = frames_ms(caller.audio_of(response.id))
        # cut where the caller's ears were: after the 600 ms heard, within what was sent
        assert 600 <= truncated.audio_end_ms <= sent_ms + FRAME_MS, (truncated.audio_end_ms, sent_ms)
        assert clip.onset_sent is not None
        audio_done = [e for e in caller.of_type("response.output_audio.done") if e.response_id == response.id]
        assert audio_done and caller.time_of(audio_done[0]) <= caller.time_of(done)
        # no audio of the cut reply after its response.done
        assert all(c.at <= caller.time_of(done) for c in caller.audio if c.response_id == response.id)
        # the interruption is a turn of its own: its reply runs to the end, then nothing is held
        second = (await caller.wait("response.created", timeout=30, after=caller.time_of(done))).response
        assert (await _response_done(caller, second.id, timeout=60)).response.status == "completed"
        await wait_idle(server.url)
    current = await stats(server.url)
    assert current["edges"]["websocket"]["live_sessions"] == 0


async def test_a_typed_message_gets_a_text_only_reply(server):
    async with WsCaller(server.url, KEY, stream=False) as caller:
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "One taro milk tea, please."}]})
        added = await caller.wait("conversation.item.added")
        assert added.item.content[0].type == "input_text" and added.item.content[0].text == "One taro milk tea, please."
        await caller.conn.response.create(response={"output_modalities": ["text"]})
        response = (await caller.wait("response.created")).response
        done = await _response_done(caller, response.id, timeout=30)
        assert done.response.status == "completed" and done.response.output_modalities == ["text"]
        text = "".join(e.delta for e in caller.of_type("response.output_text.delta"))
        assert "One taro milk tea" in text  # the toy answers what it was told
        assert caller.of_type("response.output_text.done")[0].text == text
        assert done.response.output[0].content[0].type == "output_text"
        assert not caller.audio and not caller.of_type("response.output_audio_transcript.delta")
        assert not caller.of_type("conversation.item.input_audio_transcription.completed")
        # the same text, spoken when not told otherwise (beta field name: modalities)
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "And a green tea."}]})
        await caller.conn.response.create(response={"instructions": "Say it."})
        spoken = (await caller.wait("response.created", after=caller.time_of(done))).response
        assert (await _response_done(caller, spoken.id, timeout=60)).response.status == "completed"
        assert frames_ms(caller.audio_of(spoken.id)) > 500
        await wait_idle(server.url)


async def test_a_typed_message_over_webrtc_joins_the_same_protocol(server, loopback_candidates):
    client = RealtimeClient(server.url, api_key=KEY)
    await client.connect()
    try:
        client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Two jasmine teas."}]}})
        client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        done = await client.wait_event("response.done", timeout=30)
        assert done["response"]["status"] == "completed" and done["response"]["output_modalities"] == ["text"]
        text = "".join(e["delta"] for e in client.of_type("response.output_text.delta"))
        assert "Two jasmine teas." in text and not client.of_type("output_audio_buffer.started")
    finally:
        assert await client.hang_up() == 204


async def test_g711_in_and_out_with_turns_committed_by_hand(server, order):
    async with WsCaller(server.url, KEY, stream=False) as caller:
        # beta names: input_audio_format / output_audio_format, turn_detection null
        await caller.conn.send_raw(json.dumps({"type": "session.update", "session": {
            "input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw", "turn_detection": None}}))
        updated = await caller.wait("session.updated")
        assert updated.session.audio.input.format.type == "audio/pcmu"
        assert updated.session.audio.input.turn_detection is None
        speech = (np.clip(np.concatenate([order, silence(0.2)])[::3], -1, 1) * 32767).astype(np.int16)  # ~8 kHz
        for start in range(0, len(speech), 1600):  # 200 ms appends, faster than real time
            payload = base64.b64encode(g711.encode(speech[start:start + 1600], "PCMU")).decode()
            await caller.conn.input_audio_buffer.append(audio=payload)
        assert not caller.of_type("input_audio_buffer.speech_started")  # no VAD: the client ends the turn
        await caller.conn.input_audio_buffer.commit()
        committed = await caller.wait("input_audio_buffer.committed")
        await caller.conn.response.create()
        response = (await caller.wait("response.created")).response
        assert response.id
        transcript = await caller.wait("conversation.item.input_audio_transcription.completed")
        assert transcript.item_id == committed.item_id
        done = await _response_done(caller, response.id, timeout=60)
        assert done.response.status == "completed"
        deltas = [e for e in caller.of_type("response.output_audio.delta") if e.response_id == response.id]
        sizes = {len(base64.b64decode(e.delta)) for e in deltas}
        assert sizes == {160}, sizes  # one 20 ms frame of 8 kHz mu-law per delta
        mulaw = b"".join(base64.b64decode(e.delta) for e in deltas)
        assert np.sqrt(np.mean((g711.decode(mulaw, "PCMU") / 32768.0) ** 2)) > 0.01
        await caller.conn.input_audio_buffer.commit()  # nothing buffered now
        error = await caller.wait("error", after=caller.time_of(done))
        assert error.error.code == "input_audio_buffer_commit_empty"


async def test_items_waiting_can_be_deleted_answered_ones_cannot(server):
    async with WsCaller(server.url, KEY, stream=False) as caller:
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "never mind"}]})
        item = (await caller.wait("conversation.item.added")).item
        await caller.conn.conversation.item.delete(item_id=item.id)
        assert (await caller.wait("conversation.item.deleted")).item_id == item.id
        await caller.conn.conversation.item.delete(item_id=item.id)
        assert (await caller.wait("error")).error.code == "item_not_deletable"


async def test_bad_events_get_error_events_and_the_session_goes_on(server):
    async with WsCaller(server.url, KEY, stream=False) as caller:
        cases = [("not json", "invalid_json"), (json.dumps({"type": "no.such.event"}), "unknown_event"),
                 (json.dumps({"type": "input_audio_buffer.append", "audio": "***"}), "invalid_audio"),
                 (json.dumps({"type": "conversation.item.create", "event_id": "e7",
                              "item": {"type": "message", "role": "user", "content": []}}), "empty_item"),
                 (json.dumps({"type": "session.update", "session": {"audio": {"input": {
                     "format": {"type": "audio/pcm", "rate": 16000}}}}}), "invalid_session_settings"),
                 (json.dumps({"type": "response.cancel"}), "response_cancel_not_active")]
        for raw, code in cases:
            since = time.monotonic()
            await caller.conn.send_raw(raw)
            error = await caller.wait("error", after=since)
            assert error.error.code == code, (raw, error)
        assert caller.of_type("error")[3].error.event_id == "e7"
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "still there?"}]})
        await caller.conn.response.create(response={"output_modalities": ["text"]})
        response = (await caller.wait("response.created")).response
        assert (await _response_done(caller, response.id, timeout=30)).response.status == "completed"


async def test_an_oversize_frame_is_an_error_then_a_clean_close(server):
    caller = WsCaller(server.url, KEY, stream=False)
    await caller.connect()
    try:
        await caller.conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * MAX_FRAME}))
        error = await caller.wait("error")
        assert error.error.code == "event_too_large"
        with pytest.raises(ConnectionError):
            await caller.wait("session.updated", timeout=10)  # nothing more comes: the server closed
        assert caller.close_code == 1009
    finally:
        await caller.close()
    deadline = time.monotonic() + 5
    while (await stats(server.url))["edges"]["websocket"]["live_sessions"]:
        assert time.monotonic() < deadline, "the closed connection's session is still open"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def short_server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "2", "--api-key", KEY,
                        "--ws-max-session-s", "3", "--ws-append-rate", "1"]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


async def test_session_length_and_append_rate_limits_close_cleanly(short_server):
    before = time.monotonic()  # the server's clock for the session starts after this
    async with WsCaller(short_server.url, KEY, stream=False) as caller:
        error = await caller.wait("error", timeout=10)
        assert error.error.code == "session_expired"
        assert caller.time_of(error) - before >= 3
        with pytest.raises(ConnectionError):
            await caller.wait("session.updated", timeout=5)
        assert caller.close_code == 1000  # a normal close: the SDK's iteration just ends
    async with WsCaller(short_server.url, KEY, stream=False) as caller:
        await caller.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await caller.wait("session.updated")
        ten_seconds = base64.b64encode(bytes(2 * RATE * 10)).decode()  # 10 s of silence per append
        for _ in range(7):  # 70 s at once: past the 60 s burst, and the rate refills 1 s per second
            await caller.conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": ten_seconds}))
        error = await caller.wait("error", timeout=10)
        assert error.error.code == "rate_limit_exceeded"
        with pytest.raises(ConnectionError):
            await caller.wait("session.updated", timeout=5, after=time.monotonic())
        assert caller.close_code == 1008


async def test_the_client_ends_a_websocket_session_and_keypad_digits_are_refused(server):
    """The WebSocket door can end its call (``duplex.call.end``: the socket closes 1000 after
    what was queued) and nothing else: digits are an error naming why."""
    from websockets.asyncio.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=duplex"
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "duplex.call.dtmf", "digits": "1", "event_id": "d"}))
        await ws.send(json.dumps({"type": "duplex.call.end", "event_id": "e"}))
        events = [json.loads(message) async for message in ws]  # until the server closes
        assert ws.close_code == 1000
    refusal = next(e["error"] for e in events if e["type"] == "error")
    assert refusal["event_id"] == "d" and refusal["code"] == "call_control_refused"
    assert "WebSocket session cannot send keypad digits" in refusal["message"]
    assert [e for e in events if e["type"] == "duplex.call.ending"]
    await wait_idle(server.url)

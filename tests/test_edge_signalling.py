"""Bad input at the edge: malformed offers, limits, unknown data-channel events, calls that
never send audio. Each gets a clear error and harms no other session; nothing is left behind."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
import numpy as np
import pytest

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.offer import offer_sdp

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates")]
MAX_SESSIONS = 2


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback",
                        "--max-sessions", str(MAX_SESSIONS)]) as proc:
        yield proc
    assert proc.stop() == 0


async def post_offer(url: str, body: str | bytes, content_type: str = "application/sdp") -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        return await http.post("/v1/realtime/calls", content=body, headers={"Content-Type": content_type})


async def get_stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/duplex/stats")).json()


async def no_sessions_left(url: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = await get_stats(url)
        if stats["sessions"]["live"] == 0 and stats["edges"]["webrtc"]["live_calls"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.05)


def error_message(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


async def test_malformed_offers_get_400_with_a_reason(server):
    good = await offer_sdp()
    cases = {
        "not sdp at all": ("hello", "v=0"),
        "no audio m-line": (await offer_sdp(audio=False), "no audio m-line"),
        "video": (await offer_sdp(video=True), "audio (and the oai-events channel) only"),
        "no opus": (re.sub(r"(?m)^a=rtpmap:\d+ opus/48000/2\r?\n", "", good), "Opus"),
        "no fingerprint": (re.sub(r"(?m)^a=fingerprint:.*\r?\n", "", good), "fingerprint"),
        # cut mid-line: the cut line is named, or the WebRTC stack refuses what is left
        "truncated": (good[: len(good) // 2], ("of the offer:", "cannot answer")),
    }
    for name, (body, reasons) in cases.items():
        reply = await post_offer(server.url, body)
        assert reply.status_code == 400, (name, reply.text)
        reasons = (reasons,) if isinstance(reasons, str) else reasons
        assert any(reason in error_message(reply) for reason in reasons), (name, error_message(reply))
    reply = await post_offer(server.url, b"\xff\xfe\x00garbage")
    assert reply.status_code == 400 and "UTF-8" in error_message(reply)
    await no_sessions_left(server.url)


async def test_malformed_lines_are_refused_naming_the_line_before_any_session(server):
    """What an attack run sent: each refused 400 with the line and why (the WebRTC stack's parser
    used to answer a bare 'AssertionError()' or accept the offer), and no session is opened."""
    good = await offer_sdp()
    fingerprint = re.search(r"(?m)^a=fingerprint:sha-256 (.*)\r?$", good)
    assert fingerprint is not None
    cases = {
        "m=audio port abc": (re.sub(r"(?m)^m=audio \d+", "m=audio abc", good), "the port 'abc' is not a number"),
        "rtpmap payload type 999": (re.sub(r"(?m)^a=rtpmap:\d+ opus", "a=rtpmap:999 opus", good),
                                    "payload type '999' is not a number 0..127"),
        "NUL in s=": (good.replace("\ns=-", "\ns=a\x00b"), "control character"),
        "sha-999 fingerprint": (good.replace(fingerprint.group(0), "a=fingerprint:sha-999 " + fingerprint.group(1)),
                                "unknown fingerprint hash 'sha-999'"),
        "c= without an address": (re.sub(r"(?m)^c=IN IP4 \S+", "c=IN IP4", good, count=1),
                                  "'c=' takes 'IN IP4 <address>'"),
    }
    before = (await get_stats(server.url))["sessions"]["opened"]
    for name, (body, reason) in cases.items():
        reply = await post_offer(server.url, body)
        assert reply.status_code == 400, (name, reply.text)
        message = error_message(reply)
        assert reason in message and re.match(r"line \d+ \(", message), (name, message)
        assert "AssertionError" not in message
    assert (await get_stats(server.url))["sessions"]["opened"] == before
    await no_sessions_left(server.url)


async def test_size_and_content_type_limits(server):
    reply = await post_offer(server.url, "v=0\r\n" + "a=x\r\n" * 20000)
    assert reply.status_code == 413
    reply = await post_offer(server.url, json.dumps({"sdp": "v=0"}), "application/json")
    assert reply.status_code == 415 and "application/sdp" in error_message(reply)
    # the Realtime API takes application/sdp: a well-formed offer as text/plain is another type
    reply = await post_offer(server.url, await offer_sdp(), "text/plain")
    assert reply.status_code == 415 and "'text/plain'" in error_message(reply)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        reply = await http.post("/v1/realtime/calls",
                                files={"sdp": (None, await offer_sdp()), "session": (None, "{nope")})
        assert reply.status_code == 400 and "'session' field" in error_message(reply)
        reply = await http.post("/v1/realtime/calls", files={"session": (None, "{}")})
        assert reply.status_code == 400 and "no 'sdp' field" in error_message(reply)
        assert (await http.delete("/v1/realtime/calls/rtc_unknown")).status_code == 404
    await no_sessions_left(server.url)


async def test_full_server_answers_503_then_recovers(server):
    clients = [RealtimeClient(server.url) for _ in range(MAX_SESSIONS)]
    for client in clients:
        await client.connect()
    try:
        reply = await post_offer(server.url, await offer_sdp())
        assert reply.status_code == 503
        assert reply.headers["Retry-After"] and "sessions are in use" in error_message(reply)
        assert (await get_stats(server.url))["sessions"]["rejected_full"] >= 1
        assert await clients[0].hang_up() == 204
        late = RealtimeClient(server.url)
        await late.connect()  # a freed slot is usable at once
        clients[0] = late
    finally:
        for client in clients:
            await client.hang_up()
    await no_sessions_left(server.url)


async def test_multipart_offer_applies_session_settings(server):
    client = RealtimeClient(server.url)
    turn_detection = {"type": "server_vad", "silence_duration_ms": 700}
    await client.connect(session={"type": "realtime", "instructions": "be brief",
                                  "audio": {"input": {"turn_detection": turn_detection}}})
    try:
        created = client.of_type("session.created")[0]["session"]
        assert created["instructions"] == "be brief"
        assert created["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 700
    finally:
        await client.hang_up()


async def test_bad_data_channel_events_get_error_events_and_the_session_survives(server):
    client = RealtimeClient(server.url)
    await client.connect(ignore_max_message_size=True)  # so it can send the over-size event
    try:
        bad = {
            "not json": "invalid_json",
            json.dumps({"type": "session.explode"}): "unknown_event",
            json.dumps({"event_id": "e1"}): "missing_type",
            json.dumps({"type": "conversation.item.truncate", "item_id": 5, "audio_end_ms": 1}): "invalid_event",
            json.dumps({"type": "session.update", "session": {"turn_detection": {"threshold": 7}}}):
                "invalid_session_settings",
            json.dumps({"type": "response.cancel"}): "response_cancel_not_active",
            json.dumps({"type": "response.create", "pad": "x" * 70000}): "event_too_large",
        }
        for message in bad:
            client.send(message)
        deadline = time.monotonic() + 5
        while len(client.of_type("error")) < len(bad):
            assert time.monotonic() < deadline, client.of_type("error")
            await asyncio.sleep(0.02)
        assert [e["error"]["code"] for e in client.of_type("error")] == list(bad.values())
        unknown = client.of_type("error")[1]["error"]
        assert "session.explode" in unknown["message"] and unknown["type"] == "invalid_request_error"

        client.send({"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": 400}}})
        updated = await client.wait_event("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
        client.mic.play(espeak("Hello there"))
        created = await client.wait_event("response.created", timeout=15)
        client.send({"type": "response.cancel"})
        done = await client.wait_event("response.done", timeout=5)
        assert done["response"]["id"] == created["response"]["id"]
        assert done["response"]["status"] == "cancelled"
        client.send({"type": "response.create"})  # a reply without new speech
        created = await client.wait_event("response.created", timeout=5, after=client.time_of(done))
        await client.wait_event("output_audio_buffer.started", timeout=10, response_id=created["response"]["id"])
        client.send({"type": "response.create"})
        busy = await client.wait_event("error", timeout=5, after=client.time_of(created))
        assert busy["error"]["code"] == "conversation_already_has_active_response"
    finally:
        await client.hang_up()
    await no_sessions_left(server.url)


async def test_a_call_that_sends_no_speech_starts_no_turn_and_hangs_up_cleanly(server):
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        await asyncio.sleep(1.0)  # a second of a silent microphone: the time being tested
        stats = await get_stats(server.url)
        session = next(iter(stats["sessions"]["sessions"].values()))
        assert session["state"] == "idle" and session["turns"] == 0
        assert not client.of_type("input_audio_buffer.speech_started")
        assert len(client.heard) > 20 and max(h.rms for h in client.heard) < 1e-3  # silence flows, at pace
    finally:
        assert await client.hang_up() == 204
    stats = await no_sessions_left(server.url)
    assert all(v["live_requests"] == 0 for v in stats["stages"].values())


async def test_garbage_datagrams_at_the_media_port_harm_no_call(server):
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        ports = {int(m) for m in re.findall(r"a=candidate:\S+ \d+ udp \d+ 127\.0\.0\.1 (\d+) typ host",
                                             client.pc.remoteDescription.sdp)}
        assert ports
        rng = np.random.default_rng(5)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for i in range(300):
                size = int(rng.integers(1, 1400))
                junk = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
                if i % 3 == 0 and size > 12:
                    junk[0], junk[1] = 0x80, 111  # looks like RTP with the Opus payload type
                for port in ports:
                    sock.sendto(bytes(junk), ("127.0.0.1", port))
        finally:
            sock.close()
        client.mic.play(espeak("Hello there"))
        created = await client.wait_event("response.created", timeout=15)
        await client.wait_event("output_audio_buffer.started", timeout=10, response_id=created["response"]["id"])
    finally:
        assert await client.hang_up() == 204
    await no_sessions_left(server.url)

"""The Twilio Media Streams endpoint's protocol handling, over a real WebSocket to an in-process
uvicorn server whose calls are answered by a tone agent (the real conversation is exercised in
test_twilio_e2e.py). Message codec units first."""

from __future__ import annotations

import asyncio
import base64

import msgspec
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from duplex.edge.phone.bridge import AgentUnavailable
from duplex.edge.twilio import messages as tm
from duplex.edge.twilio.stream import TwilioEndpoint
from tests.sip_helpers import ToneAgent, wait_until
from tests.twilio_client import TwilioPeer

pytestmark = pytest.mark.timeout(60)

START = ('{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1",'
         '"callSid":"CA1","tracks":["inbound"],"customParameters":{"from":"+1"},'
         '"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},'
         '"streamSid":"MZ1"}')


def test_inbound_messages_decode():
    assert isinstance(tm.decode_inbound('{"event":"connected","protocol":"Call",'
                                        '"version":"1.0.0"}'), tm.Connected)
    start = tm.decode_inbound(START)
    assert isinstance(start, tm.Start) and start.start.callSid == "CA1"
    assert start.start.mediaFormat.sampleRate == 8000
    assert start.start.customParameters["from"] == "+1"
    media = tm.decode_inbound('{"event":"media","sequenceNumber":"3","media":{"track":"inbound",'
                              '"chunk":"1","timestamp":"5","payload":"//8="},"streamSid":"MZ1"}')
    assert tm.b64decode(media.media.payload) == b"\xff\xff"
    mark = tm.decode_inbound('{"event":"mark","sequenceNumber":"4","streamSid":"MZ1",'
                             '"mark":{"name":"m1"}}')
    assert mark.mark.name == "m1"
    dtmf = tm.decode_inbound('{"event":"dtmf","streamSid":"MZ1","sequenceNumber":"5",'
                             '"dtmf":{"track":"inbound_track","digit":"7"}}')
    assert dtmf.dtmf.digit == "7"
    stop = tm.decode_inbound('{"event":"stop","sequenceNumber":"6","streamSid":"MZ1",'
                             '"stop":{"accountSid":"AC1","callSid":"CA1"}}')
    assert stop.stop.callSid == "CA1"


def test_outbound_messages_encode():
    assert msgspec.json.decode(tm.encode(tm.Clear(streamSid="MZ1"))) == {
        "event": "clear", "streamSid": "MZ1"}
    media = msgspec.json.decode(tm.encode(tm.OutMedia(streamSid="MZ1",
                                                      media=tm.OutboundPayload("AAA="))))
    assert media == {"event": "media", "streamSid": "MZ1", "media": {"payload": "AAA="}}
    mark = msgspec.json.decode(tm.encode(tm.OutMark(streamSid="MZ1", mark=tm.MarkInfo("x"))))
    assert mark == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "x"}}


@pytest.mark.parametrize("text", ['{"event":"bogus"}', "not json", "[]", '{"event":"media"}',
                                  '{"event":"start","start":{"mediaFormat":{"sampleRate":"x"}}}'])
def test_bad_messages_raise(text):
    with pytest.raises(msgspec.MsgspecError):
        tm.decode_inbound(text)


class _Agents:
    def __init__(self) -> None:
        self.made: list[ToneAgent] = []
        self.full = False

    async def __call__(self, info):
        if self.full:
            raise AgentUnavailable("all 0 sessions are in use")
        agent = ToneAgent()
        agent.speaking = False
        self.made.append(agent)
        return agent


@pytest.fixture
async def endpoint():
    agents = _Agents()
    twilio = TwilioEndpoint(agents)
    app = FastAPI()
    app.include_router(twilio.router())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    task = asyncio.get_running_loop().create_task(server.serve())
    await wait_until(lambda: server.started, 10, "uvicorn")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield twilio, agents, f"ws://127.0.0.1:{port}/twilio/media-stream", port
    server.should_exit = True
    await task


async def test_stream_carries_audio_both_ways_and_clears_on_barge_in(endpoint):
    twilio, agents, url, _ = endpoint
    async with TwilioPeer(url) as peer:
        await peer.begin()
        await wait_until(lambda: agents.made, 5, "an agent")
        agent = agents.made[0]
        loud = (8000 * np.sin(np.arange(1600) / 3)).astype(np.int16)
        await peer.stream(loud)
        await wait_until(lambda: sum(len(c) for c in agent.caller) >= 3000, 5, "caller audio")
        heard = np.concatenate(agent.caller)
        assert np.sqrt(np.mean(heard.astype(float) ** 2)) > 2000  # 16 kHz, loud

        agent.speaking = True
        await peer.wait_for(lambda: len(peer.of("media")) >= 10, what="agent media")
        first = peer.of("media")[0][1]
        assert first["streamSid"] == peer.stream_sid
        assert len(base64.b64decode(first["media"]["payload"])) == 160
        agent.speaking = False  # the agent finished a stretch of speech: a mark follows it
        await peer.wait_for(lambda: peer.of("mark"), what="the end-of-speech mark")
        await peer.send("mark", mark={"name": peer.of("mark")[0][1]["mark"]["name"]})
        agent.speaking = True
        count = len(peer.of("media"))
        await peer.wait_for(lambda: len(peer.of("media")) > count + 5, what="more media")
        agent.speaking = False
        agent.listener()  # the conversation reports a barge-in
        await peer.wait_for(lambda: peer.of("clear"), what="clear")
        assert peer.of("clear")[0][1] == {"event": "clear", "streamSid": peer.stream_sid}
        await peer.send("dtmf", dtmf={"track": "inbound_track", "digit": "9"})
        await wait_until(lambda: agent.digits == ["9"], 5, "digit")
        await peer.stop()
        await peer.wait_for(lambda: peer.closed is not None, what="server closing")
    assert peer.closed[0] == 1000
    await wait_until(lambda: twilio.stats()["streams"] == 0 and ToneAgent.closed >= 1, 5,
                     "stream freed")
    assert twilio.stats()["clears_sent"] == 1


async def test_garbage_is_dropped_and_the_stream_survives(endpoint):
    twilio, agents, url, _ = endpoint
    async with TwilioPeer(url) as peer:
        await peer.send("media", media={"payload": "//8="})  # media before start
        await peer.begin()
        await wait_until(lambda: agents.made, 5, "an agent")
        for junk in ("not json", '{"event":"surprise"}', "[1,2,3]", '{"event":"media"}',
                     "x" * 70000):
            await peer.send_raw(junk)
        await peer.send_raw(b"\x00binary frame")
        await peer.send("media", media={"payload": "not base64 at all!"})
        await peer.send("media", media={"payload": base64.b64encode(b"\xff" * 9000).decode()})
        await peer.begin()  # a second start on the same stream
        await peer.send("media", media={"payload": base64.b64encode(b"\x00" * 160).decode()})
        agent = agents.made[0]
        await wait_until(lambda: agent.caller, 5, "good media after the junk")
        assert len(agents.made) == 1
        stats = twilio.stats()
        assert stats["bad_messages"] == 6 and stats["oversize"] == 1
        assert stats["bad_media"] == 2 and stats["binary_frames"] == 1
        await peer.stop()
        await peer.wait_for(lambda: peer.closed is not None, what="server closing")
    await wait_until(lambda: twilio.stats()["streams"] == 0, 5, "stream freed")


async def test_unsupported_media_format_is_refused(endpoint):
    twilio, agents, url, _ = endpoint
    async with TwilioPeer(url) as peer:
        await peer.begin(media_format={"encoding": "audio/x-l16", "sampleRate": 16000,
                                       "channels": 1})
        await peer.wait_for(lambda: peer.closed is not None, what="refusal")
    assert peer.closed[0] == 1003 and "media format" in peer.closed[1]
    assert not agents.made and twilio.stats()["streams_refused"] == 1


async def test_full_server_refuses_the_stream(endpoint):
    twilio, agents, url, _ = endpoint
    agents.full = True
    async with TwilioPeer(url) as peer:
        await peer.begin()
        await peer.wait_for(lambda: peer.closed is not None, what="refusal")
    assert peer.closed[0] == 1003 and "no session" in peer.closed[1]
    await wait_until(lambda: twilio.stats()["streams"] == 0, 5, "stream freed")


async def test_twiml_points_the_call_at_the_stream(endpoint):
    import httpx

    _, _, _, port = endpoint
    async with httpx.AsyncClient() as http:
        reply = await http.post(f"http://127.0.0.1:{port}/twilio/voice")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/xml")
    assert f'<Stream url="ws://127.0.0.1:{port}/twilio/media-stream"/>' in reply.text

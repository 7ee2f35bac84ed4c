"""What a Twilio stream does for its conversation (duplex/edge/twilio/control.py), over a real
WebSocket to an in-process uvicorn server, with Twilio's message shapes (tests/twilio_client.py)
and a real session behind it (scripted runtime): a ``dtmf`` message reaches the thinker as text;
the reply's ``end_call`` closes the stream (1000) once its audio has played (its mark echoed);
digits out and transfer are refused, naming Twilio's REST API."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from fastapi import FastAPI

from duplex.config.session import SessionConfig
from duplex.edge.phone.session_agent import SessionCallAgent, session_agents
from duplex.edge.twilio.stream import TwilioEndpoint
from duplex.runtime.contract import ToolCallDone
from duplex.session.call_control import CallControlRefused
from duplex.session.manager import SessionManager
from duplex.session.realtime import call_events as cev
from tests.session_fakes import FakeRuntime
from tests.sip_helpers import wait_until
from tests.twilio_client import TwilioPeer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def door():
    runtime = FakeRuntime()
    events: list = []
    sessions = SessionManager(runtime, SessionConfig(call_tools=["end_call", "send_dtmf"], keypad_gap_ms=100),
                              max_sessions=2, model="test")
    agents: list[SessionCallAgent] = []
    make = session_agents(sessions, lambda info, event: events.append(event))

    async def factory(info):
        agent = await make(info)
        agents.append(agent)
        return agent

    twilio = TwilioEndpoint(factory)
    app = FastAPI()
    app.include_router(twilio.router())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.get_running_loop().create_task(server.serve())
    await wait_until(lambda: server.started, 10, "uvicorn")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield twilio, runtime, sessions, agents, events, f"ws://127.0.0.1:{port}/twilio/media-stream"
    server.should_exit = True
    await task


async def _echo_marks(peer: TwilioPeer) -> None:
    """What Twilio does: each mark comes back once the audio before it has played."""
    echoed = 0
    while peer.closed is None:
        marks = peer.of("mark")
        for _, mark in marks[echoed:]:
            await peer.send("mark", mark={"name": mark["mark"]["name"]})
        echoed = len(marks)
        await asyncio.sleep(0.02)


async def test_a_keypad_digit_reaches_the_thinker_and_end_call_closes_the_stream_after_the_reply(door):
    twilio, runtime, sessions, agents, events, url = door
    async with TwilioPeer(url) as peer:
        await peer.begin()
        await wait_until(lambda: agents, 5, "the call's session")
        echo = asyncio.get_running_loop().create_task(_echo_marks(peer))
        await peer.send("dtmf", dtmf={"track": "inbound_track", "digit": "3"})
        await wait_until(lambda: runtime.turns, 5, "a turn for the digit")
        assert [e.event for e in events if isinstance(e, cev.DtmfReceived)] == ["3"]
        turn = runtime.last
        assert turn.request.text == "[the caller pressed 3 on the keypad]"
        turn.say("goodbye", "now")
        turn._put(ToolCallDone("call_1", "end_call", "{}"))
        turn.complete()
        await peer.wait_for(lambda: peer.closed is not None, what="the server closing the stream")
        await asyncio.gather(echo, return_exceptions=True)
    assert peer.closed[0] == 1000
    loud = [at for at, rms in peer.media_rms() if rms > 300]
    marks = peer.of("mark")
    assert loud and marks and max(loud) < marks[-1][0]  # the reply's audio, then its mark, then the close
    await wait_until(lambda: twilio.stats()["streams"] == 0 and sessions.live() == 0, 5, "stream freed")
    assert twilio.counters["ended_by_agent"] == 1


async def test_digits_out_and_transfer_are_refused_naming_twilios_rest_api(door):
    twilio, runtime, sessions, agents, events, url = door
    async with TwilioPeer(url) as peer:
        await peer.begin()
        await wait_until(lambda: agents, 5, "the call's session")
        control = agents[0].control
        with pytest.raises(CallControlRefused, match="cannot send keypad digits: that needs Twilio's REST API"):
            control.send_dtmf("1")
        with pytest.raises(CallControlRefused, match="cannot transfer its call"):
            await control.transfer("+15550100")
        await peer.stop()
        await peer.wait_for(lambda: peer.closed is not None, what="server closing")
    await wait_until(lambda: twilio.stats()["streams"] == 0 and sessions.live() == 0, 5, "stream freed")

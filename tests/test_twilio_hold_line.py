"""Holding the line at the Twilio Media Streams door (issue 15), over real WebSockets to an
in-process uvicorn server: streams that start and then send no media lose their session,
streams that never start are closed, calls end at the maximum duration, and `start`s are
rate-limited per source address and in total."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from duplex.edge.phone.bridge import AgentUnavailable
from duplex.edge.rate import RateConfig
from duplex.edge.twilio.config import TwilioLimits
from duplex.edge.twilio.stream import TwilioEndpoint
from tests.sip_helpers import ToneAgent, wait_until
from tests.twilio_client import TwilioPeer

pytestmark = pytest.mark.timeout(60)
SLOTS = 8  # the server's max sessions
QUIET = np.zeros(160 * 5, np.int16)  # 100 ms of the caller's silence


class _Slots:
    """Agents for at most SLOTS calls at once, as the server's session limit would allow."""

    def __init__(self, audio_fails_after: int | None = None) -> None:
        self.live = 0
        self.opened = 0
        self.audio_fails_after = audio_fails_after  # frames of agent audio before it raises

    async def __call__(self, info):
        if self.live >= SLOTS:
            raise AgentUnavailable(f"all {SLOTS} sessions are in use")
        slots = self

        class _Agent(ToneAgent):
            frames = 0

            def agent_audio(self, due: float) -> np.ndarray:
                self.frames += 1
                if slots.audio_fails_after is not None and self.frames > slots.audio_fails_after:
                    raise RuntimeError("the voice stage's output could not be read")
                return super().agent_audio(due)

            async def close(self) -> None:
                slots.live -= 1

        self.live += 1
        self.opened += 1
        agent = _Agent()
        agent.speaking = False
        return agent


@pytest.fixture
async def door():
    servers = []

    async def start(slots: _Slots | None = None, **limits):
        slots = slots or _Slots()
        twilio = TwilioEndpoint(slots, TwilioLimits(limit_loopback=True, **limits))
        app = FastAPI()
        app.include_router(twilio.router())
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                               lifespan="off"))
        task = asyncio.get_running_loop().create_task(server.serve())
        servers.append((server, task))
        await wait_until(lambda: server.started, 10, "uvicorn")
        port = server.servers[0].sockets[0].getsockname()[1]
        return twilio, slots, f"ws://127.0.0.1:{port}/twilio/media-stream"

    yield start
    for server, task in servers:
        server.should_exit = True
        await task


async def _admitted(peer: TwilioPeer, slots: _Slots) -> bool:
    """Start the stream: True once it has its session, False if the server closed it."""
    before = slots.opened
    await peer.begin()
    await wait_until(lambda: slots.opened > before or peer.closed is not None, 5, "an answer")
    return slots.opened > before


async def _closed(peer: TwilioPeer, timeout: float) -> tuple[int, str]:
    await peer.wait_for(lambda: peer.closed is not None, timeout=timeout, what="the server's close")
    return peer.closed


async def test_silent_streams_give_their_sessions_back(door):
    """SLOTS streams send `start` and then nothing: each is closed after media_timeout_s and a
    real stream gets a session within media_timeout_s + 1 s of them."""
    timeout_s = 1.0
    generous = RateConfig(per_source=6000, source_burst=1000, total=6000, total_burst=1000)
    twilio, slots, url = await door(media_timeout_s=timeout_s, rate=generous)  # retries are many
    idle = [TwilioPeer(url, stream_sid=f"MZ{n:032d}") for n in range(SLOTS)]
    for peer in idle:
        await peer.__aenter__()
        await peer.begin()
    started = time.monotonic()
    await wait_until(lambda: slots.live == SLOTS, 5, "every slot taken")
    admitted_s = None
    while admitted_s is None:  # a real caller trying again until it gets in
        async with TwilioPeer(url) as real:
            if await _admitted(real, slots):
                admitted_s = time.monotonic() - started
                await real.stream(QUIET)
                await real.stop()
                assert (await _closed(real, 5))[0] == 1000
            else:
                assert "no session" in real.closed[1]
    for peer in idle:
        code, reason = await _closed(peer, 5)
        assert code == 1000 and "no media" in reason
        await peer.__aexit__(None, None, None)
    print(f"twilio: {SLOTS} silent streams; a real one admitted {1000 * admitted_s:.0f} ms later")
    assert admitted_s <= timeout_s + 1.0
    await wait_until(lambda: twilio.stats()["streams"] == 0 and slots.live == 0, 5, "all freed")
    assert twilio.stats()["timeouts_no_media"] == SLOTS


async def test_a_stream_that_never_starts_is_closed(door):
    twilio, slots, url = await door(start_timeout_s=0.5)
    async with TwilioPeer(url) as peer:
        await peer.send("connected", protocol="Call", version="1.0.0")
        code, reason = await _closed(peer, 0.5 + 1.0)
    assert code == 1000 and "no start" in reason
    assert slots.opened == 0 and twilio.stats()["timeouts_no_start"] == 1


async def test_a_call_ends_at_the_maximum_duration(door):
    twilio, slots, url = await door(max_call_s=0.5)
    async with TwilioPeer(url) as peer:
        await peer.begin()
        began = time.monotonic()
        talking = asyncio.ensure_future(peer.stream(np.zeros(8000 * 5, np.int16)))
        code, reason = await _closed(peer, 0.5 + 1.0)
        elapsed = time.monotonic() - began
        talking.cancel()
        await asyncio.gather(talking, return_exceptions=True)
    assert code == 1000 and "maximum call duration" in reason
    assert 0.5 - 0.05 <= elapsed <= 0.5 + 1.0
    await wait_until(lambda: slots.live == 0, 5, "session freed")
    assert twilio.stats()["max_duration"] == 1


async def test_starts_are_rate_limited(door):
    twilio, slots, url = await door(rate=RateConfig(per_source=6, source_burst=2))
    codes = []
    for n in range(3):
        async with TwilioPeer(url, stream_sid=f"MZ{n:032d}") as peer:
            if await _admitted(peer, slots):
                await peer.stream(QUIET)
                await peer.stop()
            codes.append(await _closed(peer, 5))
    assert [code for code, _ in codes] == [1000, 1000, 1013]
    assert "retry after 10 s" in codes[2][1]
    assert slots.opened == 2 and twilio.stats()["rate_limited"] == 1


async def test_a_call_whose_agent_audio_fails_is_ended_with_an_error(door):
    """The agent-audio pacer raising would leave the caller hearing nothing while the stream went
    on; the call ends (1011, the cause named) and its session is freed."""
    twilio, slots, url = await door(_Slots(audio_fails_after=5))
    async with TwilioPeer(url) as peer:
        await peer.begin()
        talking = asyncio.ensure_future(peer.stream(np.zeros(8000 * 5, np.int16)))
        code, reason = await _closed(peer, 5)
        talking.cancel()
        await asyncio.gather(talking, return_exceptions=True)
    assert code == 1011 and "agent's audio failed" in reason
    await wait_until(lambda: slots.live == 0 and twilio.stats()["streams"] == 0, 5, "session freed")
    assert twilio.stats()["failed"] == 1

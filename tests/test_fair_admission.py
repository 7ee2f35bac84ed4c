"""Fair admission at every door of one real server (toy-voice, ``--limit-loopback`` so that other
loopback addresses count as other callers): one address holds at most its share of the calls
that have not connected yet (a quarter of 8 sessions: 2), the next is refused at once with 429
and ``Retry-After``, and another address is not touched. A call that connects (WebRTC media up,
a WebSocket's first event, a Twilio ``start``) or ends stops counting against its address.

The connect deadline is set long (60 s) so that what the test counts cannot expire under it on a
slow machine."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from duplex_tools.offer import offer_sdp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
CAP = 2  # RateConfig.pending_share (0.25) of --max-sessions 8
PROXY = "127.0.0.8"  # the one peer whose X-Forwarded-For the server believes


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "8", "--limit-loopback",
                        "--connect-timeout-s", "60", "--twilio", "--ice-loopback",
                        "--trusted-proxy", PROXY]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def _http(url: str, source: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=source))


async def _edge(url: str, door: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/duplex/stats")).json()["edges"][door]


async def _offer(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/realtime/calls", content=await offer_sdp(),
                           headers={"Content-Type": "application/sdp"})


async def test_half_open_webrtc_offers_from_one_address_are_capped_and_others_still_get_in(server):
    async with _http(server.url, "127.0.0.2") as attacker:
        held = [await _offer(attacker) for _ in range(CAP)]
        assert [r.status_code for r in held] == [201] * CAP
        refused = await _offer(attacker)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1 and "not connected" in refused.json()["error"]["message"]
        pending = (await _edge(server.url, "webrtc"))["rate"]["pending"]
        assert pending["pending"] == CAP and pending["refused"] >= 1
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            metrics = (await http.get("/metrics")).text
        assert 'duplex_calls_refused_total{door="webrtc",reason="pending_capped"} 1.0' in metrics

        caller = RealtimeClient(server.url, local_address="127.0.0.3")  # a real caller, elsewhere
        try:
            await caller.connect(timeout=60)
            # its media connected: it holds a session, no longer a place among the unconnected
            assert (await _edge(server.url, "webrtc"))["rate"]["pending"]["pending"] == CAP
        finally:
            await caller.hang_up()

        assert (await attacker.delete(held[0].headers["Location"])).status_code == 204
        assert (await _edge(server.url, "webrtc"))["rate"]["pending"]["pending"] == CAP - 1
        again = await _offer(attacker)  # the place it gave up is its own again
        assert again.status_code == 201
        for reply in (held[1], again):
            await attacker.delete(reply.headers["Location"])
    assert (await _edge(server.url, "webrtc"))["rate"]["pending"]["pending"] == 0


async def test_silent_websockets_from_one_address_are_capped_until_one_speaks(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime"
    silent = [await connect(url, local_addr=("127.0.0.4", 0)) for _ in range(CAP)]
    try:
        for socket in silent:
            assert json.loads(await socket.recv())["type"] == "session.created"
        with pytest.raises(websockets.InvalidStatus) as refused:
            await connect(url, local_addr=("127.0.0.4", 0))
        assert refused.value.response.status_code == 429
        other = await connect(url, local_addr=("127.0.0.5", 0))
        await other.close()

        await silent[0].send(json.dumps({"type": "input_audio_buffer.clear"}))  # it speaks: connected
        assert json.loads(await silent[0].recv())["type"] == "input_audio_buffer.cleared"
        late = await connect(url, local_addr=("127.0.0.4", 0))
        await late.close()
    finally:
        for socket in silent:
            await socket.close()


async def test_twilio_streams_without_a_start_are_capped_per_address(server):
    url = server.url.replace("http://", "ws://") + "/twilio/media-stream"
    unstarted = [await connect(url, local_addr=("127.0.0.6", 0)) for _ in range(CAP)]
    try:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await connect(url, local_addr=("127.0.0.6", 0))
        assert refused.value.response.status_code == 429
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        other = await connect(url, local_addr=("127.0.0.7", 0))
        await other.close()
        stats = await _edge(server.url, "twilio")
        assert stats["unstarted"]["refused"] >= 1 and stats["pending_capped"] >= 1
    finally:
        for socket in unstarted:
            await socket.close()


async def test_the_forwarded_address_counts_only_from_the_trusted_proxy(server):
    async def offers(source: str, forwarded: list[str]) -> list[httpx.Response]:
        async with _http(server.url, source) as http:
            replies = [await http.post("/v1/realtime/calls", content=await offer_sdp(),
                                       headers={"Content-Type": "application/sdp", "X-Forwarded-For": name})
                       for name in forwarded]
            for reply in replies:
                if reply.status_code == 201:
                    await http.delete(reply.headers["Location"])
            return replies

    # through the proxy: each caller it names is its own source
    through = await offers(PROXY, ["10.1.1.1", "10.1.1.1", "10.1.1.2", "10.1.1.2", "10.1.1.1"])
    assert [r.status_code for r in through] == [201, 201, 201, 201, 429]
    # from anyone else the header is ignored: one address, whatever it claims
    spoofed = await offers("127.0.0.9", ["10.2.2.1", "10.2.2.2", "10.2.2.3"])
    assert [r.status_code for r in spoofed] == [201, 201, 429]

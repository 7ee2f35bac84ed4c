"""A call placed through the API of one `duplex serve --sip --api-key` (toy-voice pipeline) on
loopback, to a callee of the test's own: a raw SIP socket that rings, answers and later hangs
up, and an RTP listener that times the agent's first message from the moment the 200 OK left.

The API needs the key; a target outside the allowlist is refused with 403 and says why; bad
session settings are refused with 400 before anything is dialled; after the call nothing is
left (calls, RTP sockets, client transactions, sessions)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from duplex_tools.harness import ServerProcess, wait_stats
from tests.sip_callee import Callee

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
KEY = "outbound-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FIRST_MESSAGE_BUDGET_S = 1.0
CALLS = 5


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "2", "--api-key", KEY,
                        "--sip", "127.0.0.1:0", "--sip-rtp-ports", "47000-47999",
                        "--sip-outbound-allow", "sip:*@127.0.0.1:*"]) as proc:
        match = re.search(r"SIP on udp ([\d.]+):(\d+)", "".join(proc.output))
        assert match, "".join(proc.output)
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def _nothing_left(current: dict) -> bool:
    sip = current["edges"]["sip"]
    return (sip["calls"] == 0 and sip["rtp_sockets"] == 0 and sip["agents"] == 0
            and sip["client_transactions"] == 0 and sip["outbound"]["live"] == 0
            and current["sessions"]["live"] == 0)


async def test_placed_calls_say_their_first_message_within_a_second(server):
    delays = [await _one_call(server, first=number == 0) for number in range(CALLS)]
    print("first message heard after the 200 OK (ms): " + ", ".join(f"{d * 1000:.0f}" for d in delays)
          + f"; median {sorted(delays)[len(delays) // 2] * 1000:.0f}, max {max(delays) * 1000:.0f}")
    assert max(delays) < FIRST_MESSAGE_BUDGET_S
    # the INVITEs' transactions absorb retransmitted 200 OKs for 64*T1 (RFC 6026), then go
    await wait_stats(server.url, _nothing_left, 64 * 0.5 + 5, headers=AUTH)


async def _one_call(server, first: bool) -> float:
    """One call placed, answered, its first message timed, hung up by the callee."""
    callee = Callee()
    listener = asyncio.get_running_loop().create_task(callee.listen())
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            ask = {"to": callee.uri, "first_message": "Hello, this is your appointment reminder.",
                   "session": {"instructions": "You remind people of appointments."}}
            if first:
                refused = await http.post("/v1/calls/outbound", json=ask)
                assert refused.status_code == 401  # the API key is required
            placed = await http.post("/v1/calls/outbound", json=ask, headers=AUTH)
            assert placed.status_code == 201, placed.text
            call_id = placed.json()["id"]
            assert placed.json()["state"] == "calling"
            addr = await callee.answer()
            await _wait(lambda: callee.first_loud() is not None, 10, "the first message on the wire")
            delay = callee.first_loud() - callee.ok_sent_at
            view = (await http.get(f"/v1/calls/outbound/{call_id}", headers=AUTH)).json()
            assert view["state"] == "answered" and view["sip_status"] == 200
            assert [e["type"] for e in view["events"]] == ["calling", "ringing", "answered"]
            callee.hang_up(addr)
            assert (await callee.next_response("BYE")).status == 200
            view = await _wait_state(http, call_id, "ended")
            assert view["events"][-1]["type"] == "ended" and view["reason"] == "callee hung up"
        return delay
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        callee.close()


async def test_refusals_name_what_was_wrong(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        outside = await http.post("/v1/calls/outbound", json={"to": "sip:bob@192.0.2.1:5060"}, headers=AUTH)
        assert outside.status_code == 403
        assert outside.json()["error"]["code"] == "target_not_allowed"
        assert "allowlist" in outside.json()["error"]["message"]
        bad = await http.post("/v1/calls/outbound", headers=AUTH, json={
            "to": "sip:bob@127.0.0.1:5999", "session": {"turn_detection": {"type": "shouting"}}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_session_settings"
        assert "shouting" in bad.json()["error"]["message"]
        shape = await http.post("/v1/calls/outbound", headers=AUTH, json={"to": "sip:bob@127.0.0.1", "x": 1})
        assert shape.status_code == 400 and shape.json()["error"]["code"] == "invalid_request"
        missing = await http.get("/v1/calls/outbound/out_nothing", headers=AUTH)
        assert missing.status_code == 404
    await wait_stats(server.url, _nothing_left, 10, headers=AUTH)


async def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _wait_state(http: httpx.AsyncClient, call_id: str, state: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        view = (await http.get(f"/v1/calls/outbound/{call_id}", headers=AUTH)).json()
        if view["state"] == state:
            return view
        assert time.monotonic() < deadline, f"call never {state}: {view}"
        await asyncio.sleep(0.05)

"""What a WebRTC call does for its conversation (duplex/edge/webrtc/control.py): the gateway with
a stand-in peer (the offer is a real aiortc offer) and a real session (scripted runtime): a
``duplex.call.end`` from the client closes the call and its session; keypad digits and transfer
are refused with an ``error`` event naming why."""

from __future__ import annotations

import json

import pytest

from duplex.config.session import SessionConfig
from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc.gateway import WebRTCGateway
from duplex.session.manager import SessionManager
from duplex_tools.offer import offer_sdp
from tests.session_fakes import FakeRuntime
from tests.sip_helpers import wait_until

pytestmark = pytest.mark.timeout(60)


class StandInPeer:
    low_latency = False

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed = False

    @property
    def state(self) -> str:
        return "closed" if self.closed else "connected"

    @property
    def channel_open(self) -> bool:
        return not self.closed

    async def answer(self, offer: str) -> str:
        return "v=0\r\n"

    def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def flush(self, timeout_s: float) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def test_the_client_ends_a_webrtc_call_and_digits_and_transfer_are_refused():
    sessions = SessionManager(FakeRuntime(), SessionConfig(), max_sessions=2, model="test")
    peers: list[StandInPeer] = []

    def make(call_id, listener, pull):
        peers.append(StandInPeer())
        return peers[-1]

    gateway = WebRTCGateway(sessions, EdgeConfig(), peers=make)
    call, _ = await gateway.answer(await offer_sdp())
    call.client_message(json.dumps({"type": "duplex.call.dtmf", "digits": "1", "event_id": "d"}))
    call.client_message(json.dumps({"type": "duplex.call.transfer", "target": "+15550100", "event_id": "t"}))
    await wait_until(lambda: [e for e in peers[0].sent if e["type"] == "duplex.call.transfer_result"], 5,
                     "the transfer's refusal")
    errors = {e["error"]["event_id"]: e["error"] for e in peers[0].sent if e["type"] == "error"}
    assert errors["d"]["code"] == "call_control_refused" and "keypad tones" in errors["d"]["message"]
    assert errors["t"]["code"] == "call_control_refused" and "cannot be transferred" in errors["t"]["message"]
    call.client_message(json.dumps({"type": "duplex.call.end", "event_id": "e"}))
    await wait_until(lambda: peers[0].closed and not gateway.calls and sessions.live() == 0, 5, "the call closed")
    assert [e for e in peers[0].sent if e["type"] == "duplex.call.ending"]
    await gateway.close_all()

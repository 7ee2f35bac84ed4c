"""The agent ends a phone call itself, end to end: `duplex serve --config engine` (its real
Whisper and Piper stages and the engine thinker) with a SIP door, the thinker's engine a tiny
chat-completions server of the test's (tests/engine_helpers.py) that says goodbye and calls
``end_call``. A SIP caller of the test's presses 1 (RFC 4733); the digit reaches the thinker as
text with the call tool among its tools; the agent's goodbye is spoken on the RTP stream and the
server's BYE comes after its last loud packet; nothing is left afterwards."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from duplex.edge.media import g711
from duplex_tools.harness import ServerProcess, wait_stats
from tests.engine_helpers import TinyEngine
from tests.sip_helpers import RtpPhone, SipPeer, answer_port, sdp_offer, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_keypad_digit_reaches_the_engine_thinker_and_its_end_call_sends_bye_after_the_goodbye():
    with TinyEngine() as engine, ServerProcess(
            ["--config", "engine", "--llm", engine.url("goodbye"), "--llm-model", "tiny", "--port", "0",
             "--max-sessions", "2", "--sip", "127.0.0.1:0", "--sip-rtp-ports", "45000-45999",
             "--session.call_tools", "[end_call]", "--session.keypad_gap_ms", "200"], ready_timeout=300) as server:
        match = re.search(r"SIP on udp ([\d.]+):(\d+)", "".join(server.output))
        assert match, "".join(server.output)
        peer, phone = SipPeer((match.group(1), int(match.group(2)))), RtpPhone()
        phone.start()
        try:
            invite, final = await peer.invite(sdp_offer(phone.port, "0 101"))
            assert final.status == 200, final.reason
            peer.ack(invite, final)
            to = (match.group(1), answer_port(final))
            await phone.wait_packets(5)  # the call's media runs: its session is open
            for end in (False, True, True, True):  # digit 1: a start, then its end three times
                phone.send_frame(to, bytes([1, 0x80 if end else 0, 0, 160]), payload_type=101, timestamp=777)
            bye = None
            deadline = time.monotonic() + 120
            while bye is None and time.monotonic() < deadline:
                phone.send_frame(to, bytes([0xFF]) * 160)  # the caller's silence, as a phone keeps sending
                try:
                    bye = await peer.next(method="BYE", timeout=0.02)
                except TimeoutError:
                    pass
            assert bye is not None, "no BYE from the agent"
            bye_at = time.monotonic()
            peer.reply(bye, 200)
            await wait_until(lambda: engine.requests, 5, "the engine's request")
            request = engine.requests[0]
            assert "[the caller pressed 1 on the keypad]" in json.dumps(request["messages"])
            assert [t["function"]["name"] for t in request["tools"]] == ["end_call"]
            loud = [at for at, p in phone.packets if p.payload_type == 0 and _rms(p.payload) > 300]
            assert loud and max(loud) < bye_at  # the goodbye was spoken, all of it before the BYE
            await wait_stats(server.url, lambda s: s["edges"]["sip"]["calls"] == 0
                             and s["edges"]["sip"]["rtp_sockets"] == 0 and s["sessions"]["live"] == 0, 10)
        finally:
            await phone.close()
            peer.close()
    assert server.stop() == 0, "".join(server.output[-30:])


def _rms(payload: bytes) -> float:
    samples = g711.decode(payload, "PCMU").astype(np.float64)
    return float(np.sqrt(np.mean(samples ** 2)))

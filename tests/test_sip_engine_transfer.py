"""The agent transfers a phone call itself, end to end: `duplex serve --config engine` (its real
Whisper and Piper stages and the engine thinker) with a SIP door whose allowlist holds the desk,
the thinker's engine a tiny chat-completions server of the test's (tests/engine_helpers.py) that
says it puts the caller through and calls ``transfer_call``. The caller presses 1; the agent's line
is spoken on the RTP stream before the REFER, whose Refer-To is the desk and Referred-By the
agent; the caller's NOTIFYs (trying, then 200 OK) make the server leave with a BYE; nothing is
left afterwards."""

from __future__ import annotations

import json
import re
import time

import pytest

from duplex.edge.sip.headers import parse_name_addr
from duplex.edge.sip.message import SipRequest
from duplex_tools.harness import ServerProcess, wait_stats
from tests.engine_helpers import TRANSFER_TARGET, TinyEngine
from tests.sip_helpers import RtpPhone, SipPeer, answer_port, sdp_offer, wait_until
from tests.test_sip_engine_end_call import _rms

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def _next_request(peer: SipPeer, phone: RtpPhone, to: tuple[str, int], method: str,
                        timeout: float) -> SipRequest:
    """Wait for ``method`` from the server while sending the caller's silence, as a phone does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phone.send_frame(to, bytes([0xFF]) * 160)
        try:
            message = await peer.next(method=method, timeout=0.02)
        except TimeoutError:
            continue
        assert isinstance(message, SipRequest)
        return message
    raise AssertionError(f"no {method} from the agent within {timeout} s")


async def test_the_engine_thinkers_transfer_call_is_said_then_referred_and_the_notify_200_ends_the_call():
    with TinyEngine() as engine, ServerProcess(
            ["--config", "engine", "--llm", engine.url("transfer"), "--llm-model", "tiny", "--port", "0",
             "--max-sessions", "2", "--sip", "127.0.0.1:0", "--sip-rtp-ports", "45000-45999",
             "--sip-outbound-allow", TRANSFER_TARGET, "--session.call_tools", "[transfer_call]",
             "--session.keypad_gap_ms", "200"], ready_timeout=300) as server:
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
            refer = await _next_request(peer, phone, to, "REFER", 120)
            refer_at = time.monotonic()
            assert parse_name_addr(refer.get("Refer-To") or "").uri == TRANSFER_TARGET
            assert "sip:" in (refer.get("Referred-By") or "")
            loud = [at for at, p in phone.packets if p.payload_type == 0 and _rms(p.payload) > 300]
            assert loud and max(loud) < refer_at, "the agent's line is spoken before the REFER"
            request = engine.requests[0]
            assert [t["function"]["name"] for t in request["tools"]] == ["transfer_call"]
            assert "[the caller pressed 1 on the keypad]" in json.dumps(request["messages"])
            peer.reply(refer, 202, "Accepted")
            for status in (b"SIP/2.0 100 Trying\r\n", b"SIP/2.0 200 OK\r\n"):
                state = "active" if status.startswith(b"SIP/2.0 1") else "terminated;reason=noresource"
                peer.send(peer.request("NOTIFY", headers=[("Event", "refer"), ("Subscription-State", state)],
                                       body=status, content_type="message/sipfrag"))
                assert ((await peer.next(status=200)).get("CSeq") or "").endswith("NOTIFY")
            bye = await _next_request(peer, phone, to, "BYE", 10)
            peer.reply(bye, 200)
            await wait_until(lambda: len(engine.requests) >= 1, 5, "the engine's request")
            await wait_stats(server.url, lambda s: s["edges"]["sip"]["calls"] == 0
                             and s["edges"]["sip"]["rtp_sockets"] == 0 and s["sessions"]["live"] == 0, 10)
        finally:
            await phone.close()
            peer.close()
    assert server.stop() == 0, "".join(server.output[-30:])

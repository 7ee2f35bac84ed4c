"""One phone call to `duplex serve --config engine` whose thinker is a TinyEngine mode, as the
engine's SIP tests make it: the server with a SIP door, a SIP caller of the test's (SipPeer) and
its RTP phone, the call answered and its media running. On leaving, the call's resources must
all be freed and the server must stop cleanly."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from duplex.edge.sip.message import SipRequest
from duplex_tools.harness import ServerProcess, wait_stats
from tests.engine_helpers import TinyEngine
from tests.sip_helpers import RtpPhone, SipPeer, answer_port, sdp_offer

SILENCE_PCMU = bytes([0xFF]) * 160


@dataclass
class EngineCall:
    engine: TinyEngine
    server: ServerProcess
    peer: SipPeer
    phone: RtpPhone
    to: tuple[str, int]

    def press(self, digit: int) -> None:
        """One keypad digit as RFC 4733 events: its start, then its end three times."""
        for end in (False, True, True, True):
            self.phone.send_frame(self.to, bytes([digit, 0x80 if end else 0, 0, 160]), payload_type=101,
                                  timestamp=777)

    async def next_request(self, method: str, timeout: float) -> SipRequest:
        """Wait for ``method`` from the server while sending the caller's silence, as a phone does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.phone.send_frame(self.to, SILENCE_PCMU)
            try:
                message = await self.peer.next(method=method, timeout=0.02)
            except TimeoutError:
                continue
            assert isinstance(message, SipRequest)
            return message
        raise AssertionError(f"no {method} from the agent within {timeout} s")


@contextlib.asynccontextmanager
async def engine_sip_call(mode: str, flags: list[str]) -> AsyncIterator[EngineCall]:
    with TinyEngine() as engine, ServerProcess(
            ["--config", "engine", "--llm", engine.url(mode), "--llm-model", "tiny", "--port", "0",
             "--max-sessions", "2", "--sip", "127.0.0.1:0", "--sip-rtp-ports", "45000-45999", *flags],
            ready_timeout=300) as server:
        match = re.search(r"SIP on udp ([\d.]+):(\d+)", "".join(server.output))
        assert match, "".join(server.output)
        peer, phone = SipPeer((match.group(1), int(match.group(2)))), RtpPhone()
        phone.start()
        try:
            invite, final = await peer.invite(sdp_offer(phone.port, "0 101"))
            assert final.status == 200, final.reason
            peer.ack(invite, final)
            call = EngineCall(engine, server, peer, phone, (match.group(1), answer_port(final)))
            await phone.wait_packets(5)  # the call's media runs: its session is open
            yield call
            await wait_stats(server.url, lambda s: s["edges"]["sip"]["calls"] == 0
                             and s["edges"]["sip"]["rtp_sockets"] == 0 and s["sessions"]["live"] == 0, 10)
        finally:
            await phone.close()
            peer.close()
    assert server.stop() == 0, "".join(server.output[-30:])


"""What a SIP call does for its conversation (duplex/edge/sip/control.py, info.py, media/dtmf.py),
against a hand-driven peer on loopback and, for digits both ways, a real SIPp caller:

* keypad digits out are RFC 4733 events in the call's own RTP stream (same SSRC and sequence,
  the timestamp held per event, the marker on its first packet, the end packet three times);
  refused when the peer offered no telephone-event;
* digits in by SIP INFO (dtmf-relay, dtmf) reach the agent; bad INFOs are refused by kind;
* the agent's end is a BYE; transfer is refused until SIP transfer is there;
* with a real session (scripted runtime): a digit reaches the thinker as text, and its reply's
  ``end_call`` ends the call with a BYE after the reply's last word went out.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections import deque
from pathlib import Path

import pytest

from duplex.config.session import SessionConfig
from duplex.edge.media.dtmf import END_REPEATS, TONE_TICKS
from duplex.edge.media.rtp import RtpPacket
from duplex.edge.phone.session_agent import session_agents
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.uas import SipServer
from duplex.runtime.contract import ToolCallDone
from duplex.session.call_control import CallControlRefused
from duplex.session.call_tools import MAX_GROUP
from duplex.session.manager import SessionManager
from tests.session_fakes import FakeRuntime
from tests.sip_helpers import RtpPhone, SipPeer, ToneAgent, answer_port, sdp_offer, wait_until

pytestmark = pytest.mark.timeout(60)
SCENARIO = Path(__file__).parent / "sipp" / "uac_dtmf.xml"
SIPP_DTMF = Path("/usr/share/sip-tester/dtmf_2833_1.pcap")  # SIPp's own: digit 1, 10 packets


class ControlledAgent(ToneAgent):
    """A tone agent that keeps its call's control; ``echo``: answers a digit with ``echo``."""

    made: list[ControlledAgent] = []

    def __init__(self, info, echo: str = "") -> None:
        super().__init__()
        self.control = info.control
        self.echo = echo
        ControlledAgent.made.append(self)

    def dtmf(self, digit: str) -> None:
        super().dtmf(digit)
        if self.echo:
            self.control.send_dtmf(self.echo)


@pytest.fixture
async def server():
    servers: list[SipServer] = []
    ControlledAgent.made = []

    async def start(factory=None, **overrides) -> SipServer:
        async def agents(info):
            return ControlledAgent(info)

        config = SipConfig(**{"port": 0, "rtp_port_min": 43000, "rtp_port_max": 43999, "t1_ms": 50, **overrides})
        srv = SipServer(config, factory or agents)
        await srv.start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        await srv.stop()


async def _call(srv: SipServer, formats: str = "0 101") -> tuple[SipPeer, RtpPhone, int]:
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    invite, final = await peer.invite(sdp_offer(phone.port, formats))
    assert final.status == 200, final.reason
    peer.ack(invite, final)
    await wait_until(lambda: ControlledAgent.made, 5, "the agent")
    return peer, phone, answer_port(final)


async def _end(srv: SipServer, peer: SipPeer, phone: RtpPhone) -> None:
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await wait_until(lambda: srv.stats()["calls"] == 0 and srv.stats()["rtp_sockets"] == 0, 5, "call freed")
    await phone.close()
    peer.close()


def check_events(packets: list[RtpPacket], digits: str, event_pt: int = 101) -> None:
    """RFC 4733 §2.5 on the wire: per digit its own held timestamp, the marker first, durations
    growing by a frame, the end flag on the last tone packet and its two repeats."""
    stream = [p for p in packets if p.payload_type in (0, event_pt)]
    assert len({p.ssrc for p in stream}) == 1  # one stream: audio and events share the SSRC
    sequences = [p.sequence for p in stream]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(sequences, sequences[1:], strict=False))
    events = [p for p in stream if p.payload_type == event_pt]
    per_digit = TONE_TICKS + END_REPEATS - 1
    assert len(events) == per_digit * len(digits)
    for index, digit in enumerate(digits):
        group = events[index * per_digit:(index + 1) * per_digit]
        assert {p.timestamp for p in group} == {group[0].timestamp}
        assert [p.marker for p in group] == [True] + [False] * (per_digit - 1)
        codes = {p.payload[0] for p in group}
        assert codes == {"0123456789*#ABCD".index(digit)}
        ends = [bool(p.payload[1] & 0x80) for p in group]
        assert ends == [False] * (TONE_TICKS - 1) + [True] * END_REPEATS
        durations = [int.from_bytes(p.payload[2:4], "big") for p in group]
        assert durations == [160 * (i + 1) for i in range(TONE_TICKS)] + [160 * TONE_TICKS] * (END_REPEATS - 1)
    # the audio after the events goes on on the stream's clock (timestamps never go back)
    after = [p for p in stream if p.payload_type == 0 and p.sequence > events[-1].sequence]
    assert after and after[0].timestamp > events[-1].timestamp


async def test_digits_out_are_rfc4733_events_in_the_calls_own_stream(server):
    srv = await server()
    peer, phone, _ = await _call(srv)
    ControlledAgent.made[0].control.send_dtmf("1#")
    await wait_until(lambda: srv.calls.active and next(iter(srv.calls.active.values())).media.stats.dtmf_sent
                     == deque("1#"), 5, "digits sent")
    await phone.wait_packets(len(phone.packets) + 5)
    check_events([p for _, p in phone.packets], "1#")
    await _end(srv, peer, phone)


async def test_digits_are_refused_when_the_peer_offered_no_telephone_event(server):
    srv = await server()
    peer, phone, _ = await _call(srv, formats="0")
    with pytest.raises(CallControlRefused, match="did not offer telephone-event"):
        ControlledAgent.made[0].control.send_dtmf("1")
    await _end(srv, peer, phone)


async def test_the_agent_ends_the_call_with_a_bye_and_a_transfer_nowhere_allowed_is_refused(server):
    srv = await server()  # no sip.outbound.allow: the server sends calls nowhere, transfers included
    peer, phone, _ = await _call(srv)
    control = ControlledAgent.made[0].control
    with pytest.raises(CallControlRefused, match="no target is allowed"):
        await control.transfer("sip:desk@127.0.0.1")
    control.end("the agent ended the call")
    bye = await peer.next(method="BYE")
    peer.reply(bye, 200)
    await wait_until(lambda: srv.stats()["calls"] == 0 and srv.stats()["agents"] == 0, 5, "call freed")
    control.end("again")  # harmless once ended
    await phone.close()
    peer.close()


async def test_sip_info_digits_reach_the_agent_and_bad_ones_are_refused_by_kind(server):
    srv = await server()
    peer, phone, _ = await _call(srv)
    sent = [("application/dtmf-relay", b"Signal=5\r\nDuration=160\r\n", 200),
            ("application/dtmf", b"#", 200),
            ("application/dtmf-relay", b"Signal=11\r\n", 200),  # the event number of #
            ("text/plain", b"5", 415),
            ("application/dtmf", b"55", 400)]
    for content_type, body, status in sent:
        peer.send(peer.request("INFO", body=body, content_type=content_type))
        response = await peer.next(status=status)
        assert response.status == status
    stranger = SipPeer(srv.address)
    stranger.send(stranger.request("INFO", body=b"5", content_type="application/dtmf"))
    assert (await stranger.next(status=481)).status == 481  # no such call
    assert ControlledAgent.made[0].digits == ["5", "#", "#"]
    stranger.close()
    await _end(srv, peer, phone)


@pytest.mark.skipif(shutil.which("sipp") is None or not SIPP_DTMF.exists(), reason="sipp (sip-tester) missing")
async def test_sipp_sends_rfc4733_digits_and_receives_ours(server, tmp_path):
    """SIPp plays its own telephone-event capture (digit 1); the agent answers each digit with
    "42", which the test's socket, where SIPp's SDP asks for our media, receives as events."""

    async def echoing(info):
        return ControlledAgent(info, echo="42")

    srv = await server(echoing)
    scenario = SCENARIO.read_text().replace("DTMF_PCAP", str(SIPP_DTMF)).replace("TALK_MS", "3000")
    (tmp_path / "uac.xml").write_text(scenario)
    capture = RtpPhone()
    capture.start()
    host, port = srv.address
    process = await asyncio.create_subprocess_exec(
        "sipp", "-sf", "uac.xml", f"{host}:{port}", "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", "0", "-m", "1",
        "-nostdin", "-timeout", "20s", "-timeout_error", "-key", "capture_port", str(capture.port),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await wait_until(lambda: ControlledAgent.made and ControlledAgent.made[0].digits, 15, "SIPp's digit")
        assert ControlledAgent.made[0].digits == ["1"]  # ten packets, one digit (its end sent 3 times)
        await wait_until(lambda: sum(p.payload_type == 101 for _, p in capture.packets)
                         >= 2 * (TONE_TICKS + END_REPEATS - 1), 10, "our digits")
        await capture.wait_packets(len(capture.packets) + 3)  # audio after the events
        check_events([p for _, p in capture.packets], "42")
        output, _ = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, output.decode(errors="replace")[-2000:]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await capture.close()
    await wait_until(lambda: srv.stats()["calls"] == 0 and srv.stats()["rtp_sockets"] == 0, 5, "call freed")


async def test_a_digit_reaches_the_thinker_and_end_call_sends_bye_after_the_last_word():
    """A real session (scripted runtime) behind the SIP door: the caller presses 4 (RFC 4733);
    the thinker gets "[the caller pressed 4 ...]", says goodbye and calls end_call; the BYE
    comes after the reply's last loud packet went out, and nothing is left."""
    runtime = FakeRuntime()
    config = SessionConfig(call_tools=["end_call"], keypad_gap_ms=100)
    sessions = SessionManager(runtime, config, max_sessions=2, model="test")
    srv = SipServer(SipConfig(port=0, rtp_port_min=43000, rtp_port_max=43999, t1_ms=50), session_agents(sessions))
    await srv.start()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    try:
        invite, final = await peer.invite(sdp_offer(phone.port, "0 101"))
        peer.ack(invite, final)
        await wait_until(lambda: sessions.live() == 1, 5, "the call's session")
        to = (srv.address[0], answer_port(final))
        for end in (False, True, True, True):  # digit 4: a start, then its end three times
            phone.send_frame(to, bytes([4, 0x80 if end else 0, 0, 160]), payload_type=101, timestamp=4444)
        for _ in range(10):  # the caller's silence, so the server latches its RTP source
            phone.send_frame(to, bytes([0xFF]) * 160)
        await wait_until(lambda: runtime.turns, 5, "a turn for the digit")
        turn = runtime.last
        assert turn.request.text == "[the caller pressed 4 on the keypad]"
        assert [spec.name for spec in turn.request.tools] == ["end_call"]
        turn.say("goodbye", "then")
        turn._put(ToolCallDone("call_1", "end_call", "{}"))
        turn.complete()
        bye = await peer.next(method="BYE", timeout=10)
        bye_at = time.monotonic()
        peer.reply(bye, 200)
        last_loud = phone.last_loud_at()
        assert last_loud is not None and last_loud < bye_at  # the whole reply went out before the BYE
        await wait_until(lambda: sessions.live() == 0 and srv.stats()["calls"] == 0
                         and srv.stats()["rtp_sockets"] == 0, 5, "call freed")
    finally:
        await phone.close()
        peer.close()
        await srv.stop()


async def test_a_flood_of_digits_is_bounded_and_the_call_goes_on():
    """300 distinct RFC 4733 digits at once: the thinker gets at most one group of MAX_GROUP,
    the rest are dropped (counted, reported), and the call is still up and answers its BYE."""
    runtime = FakeRuntime()
    sessions = SessionManager(runtime, SessionConfig(keypad_gap_ms=100), max_sessions=2, model="test")
    srv = SipServer(SipConfig(port=0, rtp_port_min=43000, rtp_port_max=43999, t1_ms=50), session_agents(sessions))
    await srv.start()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    try:
        invite, final = await peer.invite(sdp_offer(phone.port, "0 101"))
        peer.ack(invite, final)
        await wait_until(lambda: sessions.live() == 1, 5, "the call's session")
        to = (srv.address[0], answer_port(final))
        media = next(iter(srv.calls.active.values())).media
        for burst in range(6):  # 300 digits in bursts of 50 (a socket's buffer holds ~250 datagrams)
            for stamp in range(50 * burst, 50 * (burst + 1)):
                phone.send_frame(to, bytes([stamp % 10, 0x80, 0, 160]), payload_type=101, timestamp=160 * stamp)
            await wait_until(lambda b=burst: media.stats.dtmf_in == 50 * (b + 1), 5, "the burst read")
        session = next(iter(sessions.sessions.values()))[1]
        await wait_until(lambda: runtime.turns, 5, "the digits' turn")
        pressed = runtime.turns[0].request.text.removeprefix("[the caller pressed ").removesuffix(" on the keypad]")
        assert 1 <= len(pressed) <= MAX_GROUP and session.calls.keypad_dropped >= 300 - 2 * MAX_GROUP
        assert srv.stats()["calls"] == 1  # the call goes on
        await _end(srv, peer, phone)
        await wait_until(lambda: sessions.live() == 0, 5, "session closed")
    finally:
        await srv.stop()

"""End to end against one `duplex serve --sip --twilio` (toy-voice pipeline) on loopback:

* a real SIP client (SIPp) speaks G.711 made by espeak-ng, and the test captures the RTP the
  server sends back; an interruption silences the agent on the wire;
* a phone that echoes the agent's voice back, as handsets do, must not interrupt the agent;
* a scripted Twilio Media Streams peer asks a question and gets a spoken answer; interrupting
  the agent makes the server send `clear` at once.

After every call nothing is left: no call state, RTP sockets, sessions or stage state.

SIPp's INVITE asks for our audio at the test's capture socket ([capture_port]), so the test
sees exactly the packets the server put on the wire. SIPp 3.6.1 stops sending RTP when its
file ends (FIELD_NOTES): the files carry their own trailing silence where needed.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from duplex.edge.media import g711
from duplex.edge.media.rtp import RtpPacket, parse_rtp
from duplex.session.pacing import FramePacer
from duplex_tools.harness import ServerProcess, espeak, server_stats, wait_stats
from tests.sip_helpers import RtpPhone, SipPeer, answer_port, sdp_offer
from tests.twilio_client import TwilioPeer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")]
SCENARIO = Path(__file__).parent / "sipp" / "uac_speech.xml"
CODECS = {"PCMU": 0, "PCMA": 8}
LOUD = 1000  # int16 RMS of a 20 ms frame that counts as speech


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "2",
                        "--sip", "127.0.0.1:0", "--sip-rtp-ports", "44000-44999",
                        "--twilio"]) as proc:
        match = re.search(r"SIP on udp ([\d.]+):(\d+)", "".join(proc.output))
        assert match, "".join(proc.output)
        proc.sip = (match.group(1), int(match.group(2)))
        proc.ws = proc.url.replace("http://", "ws://") + "/twilio/media-stream"
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def _nothing_left(current: dict) -> bool:
    sip = current["edges"]["sip"]
    stages_idle = all(v["live_requests"] == 0 and not any(v["resources"].values())
                      for v in current["stages"].values())
    return (sip["calls"] == 0 and sip["rtp_sockets"] == 0 and sip["agents"] == 0
            and sip["client_transactions"] == 0 and current["edges"]["twilio"]["streams"] == 0
            and current["sessions"]["live"] == 0 and stages_idle)


def _caller_file(directory: Path, codec: str, parts: list[np.ndarray]) -> tuple[Path, list[float]]:
    """G.711 at 8 kHz of the parts back to back; returns the file and each part's start (s)."""
    starts, offset = [], 0.0
    for part in parts:
        starts.append(offset)
        offset += len(part) / 8000
    pcm = g711.float_to_int16(np.concatenate(parts))
    path = directory / "caller.ul"
    path.write_bytes(g711.encode(pcm, codec))
    return path, starts


class Capture:
    """The caller's RTP receiver: every packet the server sends, with its arrival time."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.packets: list[tuple[float, RtpPacket]] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 2048)
            self.packets.append((time.monotonic(), parse_rtp(data)))

    def frame_rms(self, codec: str) -> np.ndarray:
        return np.array([np.sqrt(np.mean(g711.decode(p.payload, codec).astype(np.float64) ** 2))
                         for _, p in self.packets])


async def _call(server, tmp_path: Path, codec: str, parts: list[np.ndarray], talk_s: float,
                during=None) -> tuple[Capture, list[float]]:
    _, starts = _caller_file(tmp_path, codec, parts)
    scenario = SCENARIO.read_text().replace("PAYLOAD_TYPE", str(CODECS[codec]))
    scenario = scenario.replace("TALK_MS", str(int(talk_s * 1000)))
    (tmp_path / "uac.xml").write_text(scenario)
    capture = Capture()
    receiver = asyncio.get_running_loop().create_task(capture.run())
    host, port = server.sip
    proc = await asyncio.create_subprocess_exec(
        "sipp", "-sf", "uac.xml", f"{host}:{port}", "-i", "127.0.0.1", "-mi", "127.0.0.1",
        "-p", "0", "-m", "1", "-nostdin", "-timeout", f"{int(talk_s) + 20}s", "-timeout_error",
        "-key", "capture_port", str(capture.port), "-key", "codec_pt", str(CODECS[codec]),
        "-key", "codec_name", codec, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        if during is not None:
            await during(capture)
        output, _ = await asyncio.wait_for(proc.communicate(), talk_s + 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        capture.sock.close()
    assert proc.returncode == 0, output.decode(errors="replace")[-2000:]
    return capture, starts


def _check_stream(capture: Capture, payload_type: int) -> None:
    packets = [p for _, p in capture.packets]
    assert len(packets) > 100
    assert {p.payload_type for p in packets} == {payload_type}
    assert len({p.ssrc for p in packets}) == 1
    assert all((b.sequence - a.sequence) % 65536 == 1 for a, b in zip(packets, packets[1:]))
    assert all((b.timestamp - a.timestamp) % 2**32 == 160 for a, b in zip(packets, packets[1:]))
    assert all(len(p.payload) == 160 for p in packets)


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
async def test_sipp_call_gets_a_spoken_answer(server, tmp_path, codec):
    question = espeak("Hello, could you tell me what time it is", rate=8000)
    silence = np.zeros(8000 * 2, np.float32)  # the turn ends on silence, not on a stopped stream
    talk_s = len(question) / 8000 + 6.0
    capture, _ = await _call(server, tmp_path, codec, [question, silence], talk_s)
    _check_stream(capture, CODECS[codec])
    rms = capture.frame_rms(codec)
    question_frames = len(question) // 160
    assert np.all(rms[:question_frames] < LOUD), "the agent spoke over the caller"
    loud = np.flatnonzero(rms > LOUD)
    assert len(loud) * 0.02 > 1.5, f"only {len(loud) * 0.02:.2f} s of agent speech came back"
    assert loud[0] > question_frames  # it answered after the question, as a turn
    await wait_stats(server.url, _nothing_left)


async def test_sipp_barge_in_silences_the_agent(server, tmp_path):
    question = espeak("Hello, could you tell me what time it is", rate=8000)
    interruption = espeak("Wait, stop please", rate=8000)
    gap = np.zeros(int(8000 * 2.5), np.float32)  # the agent starts talking in this gap
    tail = np.zeros(8000 * 3, np.float32)
    barge_in_stats: list[dict] = []

    async def watch_sessions(capture: Capture) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            sessions = (await asyncio.to_thread(server_stats, server.url))["sessions"]["sessions"]
            live = [s for s in sessions.values() if s["transport"] == "sip"]
            if live and live[0]["barge_ins"] >= 1:
                barge_in_stats.append(live[0])
                return
            await asyncio.sleep(0.1)

    parts = [question, gap, interruption, tail]
    talk_s = sum(len(p) for p in parts) / 8000 + 1.0
    capture, starts = await _call(server, tmp_path, "PCMU", parts, talk_s, during=watch_sessions)
    _check_stream(capture, 0)
    assert barge_in_stats, "the session never saw a barge-in"

    # Where the caller's interruption began, on the capture's clock: SIPp starts its stream
    # on the ACK, i.e. within a few ms of our first packet (we start sending on the 200 OK).
    t0 = capture.packets[0][0]
    onset = t0 + starts[2]
    times = np.array([t for t, _ in capture.packets])
    rms = capture.frame_rms("PCMU")
    talking_at_onset = rms[(times > onset - 0.3) & (times < onset)]
    assert np.all(talking_at_onset > LOUD) or np.mean(talking_at_onset > LOUD) > 0.5, \
        "the agent was not talking when the caller interrupted"
    after = np.flatnonzero((times > onset) & (rms < LOUD))
    assert after.size, "the agent never went quiet"
    silent_at = times[after[0]]
    stop_ms = 1000 * (silent_at - onset)
    print(f"barge-in: interruption onset -> agent silent on the wire: {stop_ms:.0f} ms; "
          f"session measured {barge_in_stats[0]['last_barge_in_ms']:.0f} ms")
    assert stop_ms < 600
    quiet = rms[(times > silent_at) & (times < onset + len(interruption) / 8000)]
    assert np.all(quiet < LOUD), "agent audio came back while the caller was still talking"
    await wait_stats(server.url, _nothing_left)


async def test_sipp_options_ping_and_unknown_method(server, tmp_path):
    """SIPp's built-in OPTIONS-style probes: the server answers and stays clean."""
    host, port = server.sip
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    try:
        for method, expected in (("OPTIONS", b"SIP/2.0 200"), ("PUBLISH", b"SIP/2.0 405"),
                                 ("BREW", b"SIP/2.0 501")):
            local = sock.getsockname()[1]
            request = (f"{method} sip:agent@{host}:{port} SIP/2.0\r\n"
                       f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{method}\r\n"
                       f"From: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:agent@{host}>\r\n"
                       f"Call-ID: {method}@test\r\nCSeq: 1 {method}\r\nContent-Length: 0\r\n\r\n")
            sock.sendto(request.encode(), (host, port))
            assert sock.recv(65535).startswith(expected)
        sock.sendto(b"\x00\x01garbage", (host, port))
    finally:
        sock.close()
    current = await asyncio.to_thread(server_stats, server.url)
    assert current["edges"]["sip"]["malformed"] >= 1
    assert current["edges"]["sip"]["internal_errors"] == 0


def _live_sip_session(url: str) -> tuple[dict, dict]:
    current = server_stats(url)
    live = [v for v in current["sessions"]["sessions"].values() if v["transport"] == "sip"]
    assert live, "no live SIP session"
    return live[0], current["edges"]["sip"]["active"]


async def test_phone_echo_does_not_interrupt_the_agent(server):
    """The phone returns the agent's voice at half level, three frames late, mixed into the
    caller's microphone (a fixed echo path, as in a handset). Echo gating must keep that from
    reading as the caller barging in. (Stats are read once at the end: polling them during the
    call would load the very loops whose timing the echo path depends on.)"""
    peer, phone = SipPeer(server.sip), RtpPhone()
    phone.start()
    answered = False
    try:
        invite, final = await peer.invite(sdp_offer(phone.port, "0"))
        assert final.status == 200
        peer.ack(invite, final)
        answered = True
        media = (server.sip[0], answer_port(final))
        question = g711.float_to_int16(espeak("What is the weather like today", rate=8000))
        pacer = FramePacer(0.02)
        echo_next: int | None = None  # the received packet the phone's speaker plays next
        total = len(question) // 160 + 350  # the question, then 7 s of listening
        for frame in range(total):
            await pacer.wait_next()
            start = frame * 160
            mic = question[start:start + 160].astype(np.float64)
            mic = np.pad(mic, (0, 160 - len(mic)))
            if echo_next is None and len(phone.packets) >= 3:
                echo_next = len(phone.packets) - 3
            if echo_next is not None and echo_next < len(phone.packets):
                mic = mic + 0.5 * g711.decode(phone.packets[echo_next][1].payload, "PCMU")
                echo_next += 1
            phone.send_frame(media, g711.encode(np.clip(mic, -32768, 32767).astype(np.int16),
                                                "PCMU"))
        session, media_stats = await asyncio.to_thread(_live_sip_session, server.url)
        rms = np.array([np.sqrt(np.mean(g711.decode(p.payload, "PCMU").astype(float) ** 2))
                        for _, p in phone.packets])
        heard_s = float(np.sum(rms > LOUD)) * 0.02
        assert pacer.reanchors == 0, "the test phone could not keep time; the run proves nothing"
        assert heard_s > 2.0, f"only {heard_s:.2f} s of agent speech"
        assert session["barge_ins"] == 0, str((session, media_stats))
        assert session["echo_gated_frames"] > 0, session
        print(f"echo: {heard_s:.1f} s of agent speech played through an echoing phone, "
              f"{session['echo_gated_frames']} frames gated, delay {session['echo_delay_ms']} ms")
    finally:
        if answered:  # hang up even when an assertion failed, so later tests start clean
            peer.send(peer.request("BYE"))
            await peer.next(status=200)
        await phone.close()
        peer.close()
    await wait_stats(server.url, _nothing_left)


def _speech(text: str) -> np.ndarray:
    return g711.float_to_int16(espeak(text, rate=8000))


async def test_twilio_question_gets_a_spoken_answer(server):
    question = _speech("Hello, could you tell me what time it is")
    async with TwilioPeer(server.ws) as peer:
        await peer.begin()
        pacer = await peer.stream(question)
        asked = time.monotonic()
        await peer.stream(np.zeros(8000 * 4, np.int16), pacer)  # keep listening, as a phone does
        loud = [(t, rms) for t, rms in peer.media_rms() if rms > LOUD]
        assert len(loud) * 0.02 > 1.5, f"only {len(loud) * 0.02:.2f} s of agent speech"
        assert loud[0][0] > asked  # the answer came after the question
        assert all(m["streamSid"] == peer.stream_sid for _, m in peer.of("media"))
        assert not peer.of("clear")
        await peer.stop()
        await peer.wait_for(lambda: peer.closed is not None, what="server closing the stream")
    await wait_stats(server.url, _nothing_left)


async def test_twilio_interruption_clears_the_callers_queue(server):
    question = _speech("Hello, could you tell me what time it is")
    interruption = _speech("Wait, stop please")
    async with TwilioPeer(server.ws) as peer:
        await peer.begin()
        pacer = await peer.stream(question)
        silence = np.zeros(1600, np.int16)
        for _ in range(75):  # a phone keeps sending (silence) while the agent answers
            if sum(r > LOUD for _, r in peer.media_rms()) >= 25:
                break
            await peer.stream(silence, pacer)
        assert sum(r > LOUD for _, r in peer.media_rms()) >= 25, "the agent never talked"
        onset = time.monotonic()
        await peer.stream(interruption, pacer)
        ended = time.monotonic()
        clears = peer.of("clear")
        assert clears, "no clear was sent on barge-in"
        clear_ms = 1000 * (clears[0][0] - onset)
        print(f"twilio barge-in: interruption onset -> clear received: {clear_ms:.0f} ms")
        assert 0 < clear_ms < 600
        after_clear = [r for t, r in peer.media_rms() if clears[0][0] < t < ended]
        assert all(r < LOUD for r in after_clear), "agent audio kept coming after clear"
        await peer.stream(np.zeros(8000, np.int16), pacer)
        await peer.stop()
        await peer.wait_for(lambda: peer.closed is not None, what="server closing the stream")
    current = await wait_stats(server.url, _nothing_left)
    assert current["edges"]["twilio"]["clears_sent"] >= 1

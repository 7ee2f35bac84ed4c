"""A phone that is called (for tests of calls duplex places): answers INVITEs on a real socket,
listens to the RTP duplex sends on another (timing what it hears), and can play audio back."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import numpy as np

from duplex.edge.media import g711
from duplex.edge.media.rtp import RtpPacket, parse_rtp
from duplex.edge.sip.message import SipRequest, SipResponse, parse_message
from duplex.edge.sip.sdp import parse_sdp
from duplex.session.pacing import FramePacer
from tests.sip_helpers import wait_until

LOUD = 1000  # int16 RMS of a 20 ms frame that counts as speech
SIPP = Path(__file__).parent / "sipp"


class Callee:
    """A phone that is called: answers INVITEs on a real socket, listens to RTP on another."""

    def __init__(self) -> None:
        self.sip = _udp()
        self.rtp = _udp()
        self.packets: list[tuple[float, RtpPacket]] = []
        self.ok_sent_at = 0.0
        self.invite: SipRequest | None = None
        self.tag = "callee1"
        self._last: tuple[bytes, tuple] | None = None

    @property
    def uri(self) -> str:
        return f"sip:alice@127.0.0.1:{self.sip.getsockname()[1]}"

    async def next_request(self, method: str, timeout: float = 10.0) -> tuple[SipRequest, tuple]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            data, addr = await asyncio.wait_for(loop.sock_recvfrom(self.sip, 65535), deadline - loop.time())
            message = parse_message(data)
            if isinstance(message, SipRequest) and message.method == method:
                return message, addr

    async def next_response(self, method: str, timeout: float = 10.0) -> SipResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            data = await asyncio.wait_for(loop.sock_recv(self.sip, 65535), deadline - loop.time())
            message = parse_message(data)
            if isinstance(message, SipResponse) and (message.get("CSeq") or "").endswith(method):
                return message

    def respond(self, request: SipRequest, addr: tuple, status: int, reason: str, body: bytes = b"") -> None:
        response = SipResponse(status=status, reason=reason)
        for name in ("Via", "From", "Call-ID", "CSeq"):
            for value in request.get_all(name):
                response.add(name, value)
        to = request.get("To") or ""
        response.add("To", to if ";tag=" in to else f"{to};tag={self.tag}")
        response.add("Contact", f"<{self.uri}>")
        if body:
            response.add("Content-Type", "application/sdp")
            response.body = body
        self._last = (response.serialize(), addr)
        self.sip.sendto(response.serialize(), addr)

    async def answer(self) -> tuple:
        """The next INVITE rings, is answered, and its ACK taken; returns where it came from."""
        invite, addr = await self.next_request("INVITE")
        await self.answer_invite(invite, addr)
        await self.next_request("ACK")
        return addr

    async def answer_invite(self, invite: SipRequest, addr: tuple) -> None:
        """180, then 200 OK with our SDP (its sending time kept in ``ok_sent_at``)."""
        self.invite = invite
        self.respond(invite, addr, 180, "Ringing")
        port = self.rtp.getsockname()[1]
        sdp = ("v=0\r\no=alice 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
               f"m=audio {port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
               "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n").encode()
        self.ok_sent_at = time.monotonic()
        self.respond(invite, addr, 200, "OK", sdp)

    def resend_last(self) -> None:
        """The last response again, as a callee does whose response was not acknowledged."""
        assert self._last is not None
        self.sip.sendto(*self._last)

    async def listen(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.rtp, 2048)
            self.packets.append((time.monotonic(), parse_rtp(data)))

    def first_loud(self, after: float = 0.0) -> float | None:
        """When the first frame of speech from duplex arrived (at or after ``after``)."""
        for arrival, packet in list(self.packets):
            if arrival < after:
                continue
            pcm = g711.decode(packet.payload, "PCMU").astype(np.float64)
            if np.sqrt(np.mean(pcm ** 2)) > LOUD:
                return arrival
        return None

    def hang_up(self, addr: tuple) -> None:
        assert self.invite is not None
        bye = SipRequest(method="BYE", uri=self.invite.get("Contact").strip("<>"))
        bye.add("Via", f"SIP/2.0/UDP 127.0.0.1:{self.sip.getsockname()[1]};branch=z9hG4bKbye1;rport")
        bye.add("Max-Forwards", "70")
        bye.add("From", f"{self.invite.get('To')};tag={self.tag}")
        bye.add("To", self.invite.get("From"))
        bye.add("Call-ID", self.invite.get("Call-ID"))
        bye.add("CSeq", "1 BYE")
        self.sip.sendto(bye.serialize(), addr)

    def close(self) -> None:
        self.sip.close()
        self.rtp.close()

    async def play(self, pcm: np.ndarray) -> float:
        """Send 8 kHz int16 ``pcm`` as PCMU to duplex's RTP port, paced at 20 ms a packet; returns
        when its last packet left (monotonic)."""
        assert self.invite is not None
        port = next(m.port for m in parse_sdp(self.invite.body).media if m.kind == "audio")
        pacer = FramePacer(0.02)
        for seq, start in enumerate(range(0, len(pcm) - len(pcm) % 160, 160)):
            await pacer.wait_next()
            payload = g711.encode(pcm[start:start + 160], "PCMU")
            packet = RtpPacket(0, seq & 0xFFFF, 160 * seq, 0x5EED, payload)
            self.rtp.sendto(packet.serialize(), ("127.0.0.1", port))
        return time.monotonic()


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class SippCallee:
    """SIPp running a UAS scenario on a port of its own."""

    def __init__(self, scenario: str, tmp_path: Path, *keys: str, fill: dict[str, str] | None = None) -> None:
        self.tmp_path, self.keys = tmp_path, keys
        text = (SIPP / scenario).read_text()
        for placeholder, value in (fill or {}).items():  # SIPp checks status codes as it loads
            text = text.replace(placeholder, value)
        self.scenario = tmp_path / scenario
        self.scenario.write_text(text)
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> SippCallee:
        self.proc = await asyncio.create_subprocess_exec(
            "sipp", "-sf", str(self.scenario), "-i", "127.0.0.1", "-mi", "127.0.0.1",
            "-p", str(self.port), "-mp", "0", "-m", "1", "-nostdin", "-timeout", "20s", "-timeout_error",
            *self.keys, cwd=self.tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        await wait_until(lambda: _taken(self.port) or self.proc.returncode is not None, 10, "sipp listening")
        if self.proc.returncode is not None:
            raise AssertionError(f"sipp exited: {(await self.result())[1][-2000:]}")
        return self

    async def result(self) -> tuple[int | None, str]:
        assert self.proc is not None
        output, _ = await asyncio.wait_for(self.proc.communicate(), 30)
        return self.proc.returncode, output.decode(errors="replace")

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

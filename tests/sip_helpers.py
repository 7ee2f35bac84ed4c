"""Test kit for the phone bridge: a raw-UDP SIP peer, an RTP phone, and a recording agent.

The peer writes SIP by hand (so tests can send exactly the bytes they mean, bad ones too) and
reads the server's real responses off a real socket on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time

import numpy as np
import psutil

from duplex.edge.media import g711
from duplex.edge.media.rtp import RtpPacket, parse_rtp
from duplex.edge.sip.message import SipRequest, SipResponse, parse_message

LOOPBACK = "127.0.0.1"


def sdp_offer(port: int, formats: str = "0 8 101", extra: str = "", direction: str = "sendrecv",
              version: int = 1, address: str = LOOPBACK) -> bytes:
    lines = ["v=0", f"o=peer 1000 {version} IN IP4 {address}", "s=-", f"c=IN IP4 {address}",
             "t=0 0", f"m=audio {port} RTP/AVP {formats}", "a=rtpmap:0 PCMU/8000",
             "a=rtpmap:8 PCMA/8000", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15",
             "a=ptime:20", f"a={direction}"]
    return ("\r\n".join(lines) + "\r\n" + extra).encode()


class SipPeer:
    """A caller speaking SIP over a real UDP socket."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((LOOPBACK, 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.call_id = secrets.token_hex(8) + "@test"
        self.from_tag = secrets.token_hex(4)
        self.to_tag = ""
        self.cseq = 0
        self.received: list[SipRequest | SipResponse] = []

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, *, body: bytes = b"", branch: str | None = None,
                cseq: int | None = None, headers: list[tuple[str, str]] | None = None,
                to_tag: str | None = None, content_type: str = "application/sdp") -> SipRequest:
        if cseq is None:
            self.cseq += 1 if method not in ("ACK", "CANCEL") else 0
            cseq = self.cseq
        tag = self.to_tag if to_tag is None else to_tag
        request = SipRequest(method=method, uri=f"sip:agent@{self.server[0]}:{self.server[1]}")
        branch = branch or "z9hG4bK" + secrets.token_hex(6)
        request.add("Via", f"SIP/2.0/UDP {LOOPBACK}:{self.port};branch={branch};rport")
        request.add("Max-Forwards", "70")
        request.add("From", f"<sip:caller@{LOOPBACK}>;tag={self.from_tag}")
        request.add("To", f"<sip:agent@{LOOPBACK}>" + (f";tag={tag}" if tag else ""))
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{cseq} {method}")
        request.add("Contact", f"<sip:caller@{LOOPBACK}:{self.port}>")
        for name, value in headers or []:
            request.add(name, value)
        if body:
            request.add("Content-Type", content_type)
            request.body = body
        return request

    def send(self, message: SipRequest | bytes) -> None:
        data = message if isinstance(message, bytes) else message.serialize()
        self.sock.sendto(data, self.server)

    async def next(self, timeout: float = 5.0, *, status: int | None = None,
                   method: str | None = None) -> SipRequest | SipResponse:
        """The next message (matching status or method, others kept in ``received``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no SIP message (status={status}, method={method})")
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 65535), remaining)
            message = parse_message(data)
            self.received.append(message)
            if isinstance(message, SipResponse) and message.status > 100 and not self.to_tag:
                to = message.get("To") or ""
                if ";tag=" in to:
                    self.to_tag = to.split(";tag=")[1].split(";")[0]
            if status is not None and isinstance(message, SipResponse) and message.status == status:
                return message
            if method is not None and isinstance(message, SipRequest) and message.method == method:
                return message
            if status is None and method is None:
                return message

    async def invite(self, body: bytes, **kwargs) -> tuple[SipRequest, SipResponse]:
        """INVITE and wait for the final response (provisional ones are kept in received)."""
        invite = self.request("INVITE", body=body, **kwargs)
        self.send(invite)
        while True:
            message = await self.next(timeout=10)
            # a retransmitted 200 of an earlier INVITE (its ACK still in flight) is not this answer
            if isinstance(message, SipResponse) and message.status >= 200 \
                    and message.get("CSeq") == invite.get("CSeq"):
                return invite, message

    def ack(self, invite: SipRequest, final: SipResponse, body: bytes = b"") -> None:
        if final.status < 300:  # a 2xx ACK is a new transaction
            ack = self.request("ACK", cseq=int(invite.get("CSeq").split()[0]), body=body)
        else:  # the ACK of an error response reuses the INVITE's branch and To
            branch = invite.get("Via").split("branch=")[1].split(";")[0]
            ack = self.request("ACK", cseq=int(invite.get("CSeq").split()[0]), branch=branch)
            ack.set("To", final.get("To"))
        self.send(ack)

    def reply(self, request: SipRequest, status: int, reason: str = "OK") -> None:
        response = SipResponse(status=status, reason=reason)
        for name in ("Via", "From", "To", "Call-ID", "CSeq"):
            for value in request.get_all(name):
                response.add(name, value)
        self.send(response.serialize())


class RtpPhone:
    """The media side of a phone: receives the server's RTP, can send G.711 frames."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((LOOPBACK, 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.packets: list[tuple[float, RtpPacket]] = []
        self._task: asyncio.Task | None = None
        self._seq = 1000
        self._ts = 5000

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._receive())

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 2048)
            self.packets.append((time.monotonic(), parse_rtp(data)))

    async def wait_packets(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.packets) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.packets)} RTP packets, wanted {count}")
            await asyncio.sleep(0.02)

    def send_frame(self, to: tuple[str, int], payload: bytes, payload_type: int = 0,
                   timestamp: int | None = None) -> None:
        stamp = self._ts if timestamp is None else timestamp
        packet = RtpPacket(payload_type, self._seq, stamp, 0x1234, payload)
        self._seq = (self._seq + 1) & 0xFFFF
        self._ts += 160
        self.sock.sendto(packet.serialize(), to)

    def last_loud_at(self, rms: float = 300.0) -> float | None:
        """When the server's last loud PCMU packet arrived (monotonic), if any did; ``rms`` on the
        16-bit scale sits well above a line's silence and well below speech."""
        loud = [at for at, p in self.packets if p.payload_type == 0 and _pcmu_rms(p.payload) > rms]
        return max(loud) if loud else None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()


def answer_port(response: SipResponse) -> int:
    for line in response.body.decode().splitlines():
        if line.startswith("m=audio"):
            return int(line.split()[1])
    raise AssertionError("no m=audio in the answer")


class ToneAgent:
    """A stand-in conversation for signalling tests: records the caller, answers with a tone.

    (The real conversation, ``SessionCallAgent``, is exercised in the sipp and Twilio tests.)"""

    input_rate = 16000
    output_rate = 16000
    opened = 0
    closed = 0

    def __init__(self, frequency: float = 440.0) -> None:
        self.caller: list[np.ndarray] = []
        self.digits: list[str] = []
        self.transfers: list[tuple[str, int | None]] = []  # (state, SIP status) of transfers
        self.speaking = True
        self.listener = None
        self._phase = 0
        self._frequency = frequency
        ToneAgent.opened += 1

    def caller_audio(self, pcm: np.ndarray, arrival: float) -> None:
        self.caller.append(pcm)

    def agent_audio(self, due: float) -> np.ndarray:
        n = self.output_rate // 50
        if not self.speaking:
            return np.zeros(n, np.int16)
        t = (self._phase + np.arange(n)) / self.output_rate
        self._phase += n
        return (8000 * np.sin(2 * np.pi * self._frequency * t)).astype(np.int16)

    def dtmf(self, digit: str) -> None:
        self.digits.append(digit)

    def transfer_progress(self, target: str, state: str, status: int | None, detail: str) -> None:
        self.transfers.append((state, status))

    def set_barge_in_listener(self, listener) -> None:
        self.listener = listener

    async def close(self) -> None:
        ToneAgent.closed += 1


def udp_sockets() -> int:
    """UDP sockets this process holds (the kernel's view, not our counters)."""
    process = psutil.Process()
    connections = getattr(process, "net_connections", None) or process.connections  # psutil < 6
    return len(connections(kind="udp"))


def decode_packets(packets: list[RtpPacket], codec: str) -> np.ndarray:
    return np.concatenate([g711.decode(p.payload, codec) for p in packets]).astype(np.float64)


async def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _pcmu_rms(payload: bytes) -> float:
    samples = g711.decode(payload, "PCMU").astype(np.float64)
    return float(np.sqrt(np.mean(samples ** 2)))

"""A phone caller for the benches: SIPp places the call (INVITE, ACK, BYE: a real SIP client) and
this process is the phone's audio. The INVITE's SDP names this process's RTP socket, so the
agent's G.711 comes here, and the caller's speech leaves from the same socket, one 20 ms PCMU
packet every 20 ms (silence between utterances, as a phone sends), to where the agent's packets
come from. ``hang_up`` sends SIPp an INFO in its call (the Call-ID is fixed by ``-cid_str``), which
ends its wait and makes it send the BYE. The INFO goes unanswered: SIPp sends every message to
the agent, which would get a 200 OK to a request it never sent."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from duplex.audio import resample
from duplex.edge.media import g711
from duplex.edge.media.rtp import RtpError, RtpPacketizer, parse_rtp

RATE = 8000
FRAME = 160  # samples of one 20 ms packet
FRAME_S = FRAME / RATE
LOUD_RMS = 0.01  # agent audio at least this loud counts as speech heard (as the WebRTC client)
MAX_CALL_S = 120  # SIPp hangs up on its own after this, should the bench never say so
_SILENCE = bytes([g711.silence_byte("PCMU")]) * FRAME

_SCENARIO = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="duplex bench caller">
  <send retrans="500"><![CDATA[
INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
To: agent <sip:agent@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: sip:caller@[local_ip]:[local_port]
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=caller 1 1 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [audio_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
a=ptime:20
]]></send>
  <recv response="100" optional="true"></recv>
  <recv response="180" optional="true"></recv>
  <recv response="200" rtd="true"></recv>
  <send>IN_DIALOG_ACK</send>
  <recv request="INFO" timeout="MAX_CALL_MS" ontimeout="1"></recv>
  <label id="1"/>
  <send retrans="500">IN_DIALOG_BYE</send>
  <recv response="200" crlf="true"></recv>
</scenario>
"""


def _in_dialog(method: str, cseq: int) -> str:
    """A request of the call's dialog (the ACK, the BYE): SIPp fills the bracketed fields."""
    return f"""<![CDATA[
{method} sip:agent@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
To: agent <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: {cseq} {method}
Contact: sip:caller@[local_ip]:[local_port]
Max-Forwards: 70
Content-Length: 0
]]>"""


_SCENARIO = (_SCENARIO.replace("MAX_CALL_MS", str(MAX_CALL_S * 1000))
             .replace("IN_DIALOG_ACK", _in_dialog("ACK", 1)).replace("IN_DIALOG_BYE", _in_dialog("BYE", 2)))
_calls = itertools.count(1)


class PhoneAudio:
    """The caller's RTP: what it heard of the agent (each packet's arrival and level) and what it
    says (``say``: queued after what it is saying, silence otherwise)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.heard: list[tuple[float, float]] = []  # (arrival, RMS in [0, 1]) per agent packet
        self.agent: tuple[str, int] | None = None  # where the agent's packets come from
        self._queue: deque[tuple[bytes, asyncio.Future[float] | None]] = deque()
        self._packets = RtpPacketizer(0, FRAME)

    async def run(self) -> None:
        await asyncio.gather(self._receive(), self._send())

    def say(self, audio: np.ndarray, rate: int) -> tuple[asyncio.Future[float], float]:
        """Queue ``audio`` (float mono at ``rate``); (when its first packet left, its length in s)."""
        pcm = g711.float_to_int16(resample(np.asarray(audio, np.float32), rate, RATE))
        pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, np.int16)])
        started: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        for n, frame in enumerate(pcm.reshape(-1, FRAME)):
            self._queue.append((g711.encode(frame, "PCMU"), started if n == 0 else None))
        return started, len(pcm) / RATE

    def loud(self, since: float, until: float = float("inf")) -> list[float]:
        """Arrivals (monotonic) of the loud agent packets heard in [since, until)."""
        return [at for at, rms in self.heard if since <= at < until and rms > LOUD_RMS]

    def loud_since(self, since: float) -> float:
        """Seconds of loud agent audio heard since ``since``."""
        return FRAME_S * len(self.loud(since))

    def first_loud(self, since: float, until: float = float("inf")) -> float | None:
        return next(iter(self.loud(since, until)), None)

    def last_loud(self, since: float, until: float) -> float | None:
        loud = self.loud(since, until)
        return loud[-1] if loud else None

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data, source = await loop.sock_recvfrom(self.sock, 2048)
            try:
                packet = parse_rtp(data)
            except RtpError:  # not RTP: not the agent's audio
                continue
            self.agent = self.agent or source
            samples = g711.decode(packet.payload, "PCMU").astype(np.float64) / 32768.0
            self.heard.append((time.monotonic(), float(np.sqrt(np.mean(samples ** 2))) if samples.size else 0.0))

    async def _send(self) -> None:
        """A packet every 20 ms on the loop's clock from the agent's first packet on (its
        address is where to send); a late tick sends at once and keeps the schedule."""
        loop = asyncio.get_running_loop()
        due = None
        while True:
            if self.agent is None:
                await asyncio.sleep(FRAME_S / 4)
                continue
            due = loop.time() if due is None else due + FRAME_S
            await asyncio.sleep(max(0.0, due - loop.time()))
            payload, started = self._queue.popleft() if self._queue else (_SILENCE, None)
            self.sock.sendto(self._packets.packetize(payload), self.agent)
            if started is not None and not started.done():
                started.set_result(time.monotonic())

    def close(self) -> None:
        self.sock.close()


class SippCall:
    """One call placed by SIPp from 127.0.0.1 to ``server`` (host, port), its SDP naming
    ``audio_port`` for the agent's audio."""

    def __init__(self, server: tuple[str, int], audio_port: int) -> None:
        self.server = server
        self.audio_port = audio_port
        self.call_id = f"duplex-bench-{os.getpid()}-{next(_calls)}"
        self.sip_port = _free_udp_port()
        self.proc: asyncio.subprocess.Process | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="duplex-sipp-")

    async def start(self) -> None:
        scenario = Path(self._folder.name) / "caller.xml"
        scenario.write_text(_SCENARIO)
        self.proc = await asyncio.create_subprocess_exec(
            "sipp", "-sf", str(scenario), f"{self.server[0]}:{self.server[1]}", "-i", "127.0.0.1",
            "-mi", "127.0.0.1", "-p", str(self.sip_port), "-m", "1", "-nostdin", "-cid_str", self.call_id,
            "-timeout", f"{MAX_CALL_S + 30}s", "-timeout_error", "-key", "audio_port", str(self.audio_port),
            cwd=self._folder.name, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)

    def hang_up(self) -> None:
        """Ask SIPp to end the call (the INFO ends its wait; it sends its BYE)."""
        info = (f"INFO sip:caller@127.0.0.1:{self.sip_port} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-{self.call_id}\r\n"
                f"From: <sip:bench@127.0.0.1>;tag=bench\r\nTo: <sip:caller@127.0.0.1>\r\n"
                f"Call-ID: {self.call_id}\r\nCSeq: 1 INFO\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(info.encode(), ("127.0.0.1", self.sip_port))

    async def ended(self, timeout: float) -> str | None:
        """Wait for SIPp to exit; None if the call went as its scenario says, else why not."""
        assert self.proc is not None
        try:
            output, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            return f"SIPp did not end within {timeout:.0f} s"
        finally:
            self._folder.cleanup()
        if self.proc.returncode != 0:
            return f"SIPp exited {self.proc.returncode}: {output.decode(errors='replace')[-400:]}"
        return None


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

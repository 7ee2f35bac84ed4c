"""A Realtime WebRTC client on aiortc: plays scripted audio as its microphone, records the
agent's audio and events with arrival times. Used by tests and scripted scenarios.

The microphone can also feed back what it hears (``echo_gain``), like a phone on speaker with
no echo cancellation (``echo_path.EchoPath``: played on a steady clock, picked up a little later).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import cast

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from duplex.audio import resample
from duplex.edge.webrtc.rtc_options import receive_on_arrival, rtc_configuration, use_vectorised_audio_level
from duplex.session.pacing import FramePacer
from duplex_tools.echo_path import EchoPath

RATE = 48000
FRAME = 960  # 20 ms
ONSET_RMS = 0.01  # a clip's speech starts at its first frame this loud


@dataclass
class Clip:
    """Audio queued on the microphone; ``onset_sent`` is when its first loud frame left."""

    samples: np.ndarray  # float32 mono 48 kHz
    onset_sent: float | None = None
    speech_end_sent: float | None = None  # when its last loud frame's end left
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedMic(MediaStreamTrack):
    kind = "audio"

    def __init__(self, echo_gain: float = 0.0) -> None:
        super().__init__()
        self._pacer = FramePacer(FRAME / RATE)
        self._clips: deque[tuple[Clip, int]] = deque()
        self._pts = 0
        self.echo = EchoPath(echo_gain)

    def play(self, samples: np.ndarray, rate: int = RATE) -> Clip:
        clip = Clip(resample(samples, rate, RATE))
        self._clips.append((clip, 0))
        return clip

    def hear(self, frame: np.ndarray, pts: int | None, arrival: float) -> None:
        """A received agent frame (float mono 48 kHz) at stream position ``pts``, for echo."""
        self.echo.received(frame, pts, arrival)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        due = await self._pacer.wait_next()
        out = np.zeros(FRAME, np.float32)
        if self._clips:
            clip, pos = self._clips.popleft()
            part = clip.samples[pos:pos + FRAME]
            out[:len(part)] += part
            if np.sqrt(np.mean(part**2)) > ONSET_RMS:
                clip.speech_end_sent = time.monotonic() + len(part) / RATE
                if clip.onset_sent is None:
                    clip.onset_sent = time.monotonic()
            if pos + FRAME < len(clip.samples):
                self._clips.appendleft((clip, pos + FRAME))
            else:
                clip.ended.set()
        if self.echo.gain > 0:
            out += self.echo.echo(due - FRAME / RATE, FRAME)  # the frame leaving at ``due`` was captured before it
        pcm = (np.clip(out, -1, 1) * 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, Fraction(1, RATE)
        self._pts += FRAME
        return frame


@dataclass(frozen=True)
class Heard:
    at: float  # monotonic arrival time
    rms: float
    pcm: np.ndarray  # float32 mono 48 kHz
    pts: int | None = None  # the frame's place in the stream (48 kHz samples): gaps are lost frames


class NoEvent(TimeoutError):
    """An awaited event did not come; says what did, so a failure in CI explains itself."""

    def __init__(self, kind: str, match: dict, timeout: float, seen: list[str]) -> None:
        wanted = f"{kind} {match}" if match else kind
        super().__init__(f"no {wanted} within {timeout:g} s; since then: {', '.join(seen) or 'nothing'}")


class RealtimeClient:
    def __init__(self, base_url: str, echo_gain: float = 0.0, low_latency: bool = True,
                 api_key: str | None = None, local_address: str | None = None) -> None:
        use_vectorised_audio_level()  # many callers in one process: aiortc's own costs a core
        self.base_url = base_url.rstrip("/")
        self.local_address = local_address  # the address signalling goes from (e.g. 127.0.0.2)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # a key or a client secret
        self.mic = ScriptedMic(echo_gain)
        self.pc = RTCPeerConnection(rtc_configuration([]))
        self.low_latency = low_latency
        self.events: list[tuple[float, dict]] = []
        self.heard: list[Heard] = []
        self.call_url: str | None = None
        self.cookies = httpx.Cookies()  # a load balancer's affinity cookie goes back with the hang-up
        self._channel = self.pc.createDataChannel("oai-events")
        self._channel.on("message", self._on_message)
        self._event_added = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self.pc.on("track", self._on_track)

    async def connect(self, session: dict | None = None, timeout: float = 20.0,
                      ignore_max_message_size: bool = False) -> None:
        """``ignore_max_message_size``: disregard the answer's ``a=max-message-size`` (send data-channel
        messages up to aiortc's own 256 KiB, as a peer that does not keep to the limit would)."""
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        transport = httpx.AsyncHTTPTransport(local_address=self.local_address) if self.local_address else None
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout, cookies=self.cookies,
                                     headers=self.headers, transport=transport) as http:
            if session is None:
                reply = await http.post("/v1/realtime/calls", content=self.pc.localDescription.sdp,
                                        headers={"Content-Type": "application/sdp"})
            else:
                reply = await http.post("/v1/realtime/calls", files={
                    "sdp": (None, self.pc.localDescription.sdp), "session": (None, json.dumps(session))})
            self.cookies = http.cookies
        if reply.status_code != 201:
            raise RuntimeError(f"call refused: {reply.status_code} {reply.text}")
        self.call_url = reply.headers["Location"]
        answer = reply.text
        if ignore_max_message_size:
            answer = re.sub(r"a=max-message-size:\d+", "a=max-message-size:262144", answer)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        if self.low_latency:
            for transceiver in self.pc.getTransceivers():
                if transceiver.kind == "audio":
                    receive_on_arrival(transceiver.receiver)
        await self.wait_event("session.created", timeout=timeout)

    def send(self, event: dict | str) -> None:
        self._channel.send(event if isinstance(event, str) else json.dumps(event))

    async def wait_event(self, kind: str, timeout: float = 10.0, after: float = 0.0, **match) -> dict:
        """The first event of this type (received after monotonic time ``after``) whose fields
        equal ``match``; waits for it."""
        async def found() -> dict:
            async with self._event_added:
                while True:
                    for at, event in self.events:
                        if (at >= after and event.get("type") == kind
                                and all(event.get(k) == v for k, v in match.items())):
                            return event
                    await self._event_added.wait()
        try:
            return await asyncio.wait_for(found(), timeout)
        except TimeoutError:
            raise NoEvent(kind, match, timeout, self._recent(after)) from None

    def _recent(self, after: float, count: int = 40) -> list[str]:
        """What came since ``after``, short: the type and the ids and status a reader needs."""
        def brief(event: dict) -> str:
            response = event.get("response") or {}
            detail = [str(v) for v in (event.get("response_id") or response.get("id"), response.get("status"),
                                       event.get("kind"), (event.get("error") or {}).get("message")) if v]
            return f"{event.get('type')}({', '.join(detail)})" if detail else str(event.get("type"))
        return [brief(event) for at, event in self.events if at >= after][-count:]

    def time_of(self, event: dict) -> float:
        """When this event arrived (monotonic)."""
        return next(at for at, seen in self.events if seen is event)

    def of_type(self, kind: str) -> list[dict]:
        return [event for _, event in self.events if event.get("type") == kind]

    def loud_frames(self, since: float, until: float | None = None, threshold: float = 0.01) -> list[Heard]:
        return [h for h in self.heard if h.at >= since and (until is None or h.at < until) and h.rms > threshold]

    async def hang_up(self) -> int | None:
        status = None
        if self.call_url is not None:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=10, cookies=self.cookies,
                                         headers=self.headers) as http:
                status = (await http.delete(self.call_url)).status_code
            self.call_url = None
        await self.close()
        return status

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pc.close()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.get_running_loop().create_task(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = cast(av.AudioFrame, await track.recv())  # an audio track's frames
            except MediaStreamError:
                return
            pcm = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1) / 32768.0
            pcm = pcm.astype(np.float32)
            arrival = time.monotonic()
            self.heard.append(Heard(arrival, float(np.sqrt(np.mean(pcm**2))), pcm, frame.pts))
            self.mic.hear(pcm, frame.pts, arrival)

    def _on_message(self, message: str | bytes) -> None:
        self.events.append((time.monotonic(), json.loads(message)))
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._event_added:
            self._event_added.notify_all()

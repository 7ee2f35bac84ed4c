"""A scripted Twilio Media Streams peer: plays the provider's side of the documented protocol
(connected, start, media, mark, stop) over a real WebSocket, and records what the server sends."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
from websockets.asyncio.client import connect

from duplex.edge.media import g711
from duplex.session.pacing import FramePacer


class TwilioPeer:
    def __init__(self, url: str, stream_sid: str = "MZ00000000000000000000000000000001") -> None:
        self.url = url
        self.stream_sid = stream_sid
        self.received: list[tuple[float, dict]] = []
        self.closed: tuple[int, str] | None = None
        self._ws = None
        self._reader: asyncio.Task | None = None
        self._sequence = 0
        self._chunk = 0

    async def __aenter__(self) -> TwilioPeer:
        self._ws = await connect(self.url, max_size=2**20)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                self.received.append((time.monotonic(), json.loads(message)))
        finally:
            self.closed = (self._ws.close_code, self._ws.close_reason)

    async def send_raw(self, message: str | bytes) -> None:
        await self._ws.send(message)

    async def send(self, event: str, **body) -> None:
        self._sequence += 1
        message = {"event": event, "sequenceNumber": str(self._sequence), **body}
        if event != "connected":
            message["streamSid"] = self.stream_sid
        await self._ws.send(json.dumps(message))

    async def begin(self, media_format: dict | None = None, params: dict | None = None) -> None:
        await self.send("connected", protocol="Call", version="1.0.0")
        await self.send("start", start={
            "accountSid": "AC00000000000000000000000000000001", "streamSid": self.stream_sid,
            "callSid": "CA00000000000000000000000000000001", "tracks": ["inbound"],
            "customParameters": params or {"from": "+15550100", "to": "+15550199"},
            "mediaFormat": media_format or {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                            "channels": 1}})

    async def stream(self, pcm8k: np.ndarray, pacer: FramePacer | None = None) -> FramePacer:
        """Send int16 8 kHz audio as 20 ms media messages in real time, as the provider does."""
        pacer = pacer or FramePacer(0.02)
        for start in range(0, len(pcm8k) - 159, 160):
            await pacer.wait_next()
            self._chunk += 1
            payload = g711.encode(pcm8k[start:start + 160], "PCMU")
            await self.send("media", media={"track": "inbound", "chunk": str(self._chunk),
                                            "timestamp": str(self._chunk * 20),
                                            "payload": base64.b64encode(payload).decode()})
        return pacer

    async def stop(self) -> None:
        await self.send("stop", stop={"accountSid": "AC00000000000000000000000000000001",
                                      "callSid": "CA00000000000000000000000000000001"})

    def of(self, event: str) -> list[tuple[float, dict]]:
        return [(t, m) for t, m in self.received if m.get("event") == event]

    def media_rms(self) -> list[tuple[float, float]]:
        """(arrival, RMS) of each media message the server sent."""
        out = []
        for t, message in self.of("media"):
            pcm = g711.decode(base64.b64decode(message["media"]["payload"]), "PCMU")
            out.append((t, float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))))
        return out

    async def wait_for(self, predicate, timeout: float = 10.0, what: str = "a message") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; got "
                                   f"{[m.get('event') for _, m in self.received][-10:]}")
            await asyncio.sleep(0.02)

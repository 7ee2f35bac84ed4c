"""A Realtime WebSocket caller on the official ``openai`` SDK: a microphone that streams scripted
audio as base64 PCM 24 kHz in real time (silence between clips, as a live microphone would), and
a record of every server event (the SDK's typed events) with its arrival time. Agent audio is
decoded from ``response.output_audio.delta``. Used by tests and ``duplex bench doors``."""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from openai import AsyncOpenAI

from duplex.audio import resample
from duplex.session.pacing import FramePacer

RATE = 24000
FRAME_S = 0.02
FRAME = int(RATE * FRAME_S)
ONSET_RMS = 0.01  # a clip's speech starts at its first frame this loud


@dataclass
class Clip:
    samples: np.ndarray  # float32 mono 24 kHz
    onset_sent: float | None = None  # when its first loud frame was sent (monotonic)
    speech_end_sent: float | None = None  # when its last loud frame was sent
    end_sent: float | None = None  # when its last frame was sent
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class AudioChunk:
    at: float  # arrival (monotonic)
    response_id: str
    pcm: np.ndarray  # float32 mono 24 kHz


class WsCaller:
    def __init__(self, base_url: str, api_key: str = "none", model: str = "duplex", stream: bool = True) -> None:
        self.client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0)
        self.model = model
        self.stream = stream  # False: no microphone task (the test appends audio itself)
        self.events: list[tuple[float, Any]] = []
        self.audio: list[AudioChunk] = []
        self.conn: Any = None
        self._manager: Any = None
        self._clips: deque[tuple[Clip, int]] = deque()
        self._added = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self.closed: BaseException | None = None  # how the connection ended, once it did
        self.close_code: int | None = None  # the server's close code, once it closed

    async def __aenter__(self) -> WsCaller:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        self._manager = self.client.realtime.connect(model=self.model)
        self.conn = await self._manager.enter()
        self._tasks.append(asyncio.create_task(self._receive()))
        if self.stream:
            self._tasks.append(asyncio.create_task(self._microphone()))
        await self.wait("session.created")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.conn is not None:
            try:
                await self.conn.close()
            except Exception:  # already closed by the server
                pass

    # -- microphone -----------------------------------------------------------------------------
    def say(self, samples: np.ndarray, rate: int = RATE) -> Clip:
        clip = Clip(resample(samples, rate, RATE))
        self._clips.append((clip, 0))
        return clip

    async def _microphone(self) -> None:
        pacer = FramePacer(FRAME_S)  # a stalled loop re-anchors instead of sending a burst
        while True:
            await pacer.wait_next()
            out = np.zeros(FRAME, np.float32)
            if self._clips:
                clip, pos = self._clips.popleft()
                part = clip.samples[pos:pos + FRAME]
                out[:len(part)] = part
                if np.sqrt(np.mean(part ** 2)) > ONSET_RMS:
                    clip.speech_end_sent = time.monotonic() + len(part) / RATE
                    clip.onset_sent = clip.onset_sent or time.monotonic()
                if pos + FRAME < len(clip.samples):
                    self._clips.appendleft((clip, pos + FRAME))
                else:
                    clip.end_sent = time.monotonic()
                    clip.ended.set()
            await self.append(out)

    async def append(self, samples: np.ndarray) -> None:
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
        await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())

    # -- events ---------------------------------------------------------------------------------
    async def _receive(self) -> None:
        try:
            async for event in self.conn:
                now = time.monotonic()
                if event.type == "response.output_audio.delta":
                    pcm = np.frombuffer(base64.b64decode(event.delta), "<i2").astype(np.float32) / 32768.0
                    self.audio.append(AudioChunk(now, event.response_id, pcm))
                self.events.append((now, event))
                async with self._added:
                    self._added.notify_all()
        except Exception as exc:  # the server closed the connection
            self.closed = exc
        finally:
            if self.closed is None:
                self.closed = ConnectionError("closed")
            socket = getattr(self.conn, "_connection", None)  # the SDK's websockets connection
            self.close_code = getattr(socket, "close_code", None)
            async with self._added:
                self._added.notify_all()

    async def wait(self, kind: str, timeout: float = 20.0, after: float = 0.0, **match: Any) -> Any:
        """The first event of this type that arrived after ``after`` whose fields equal ``match``."""
        async def found() -> Any:
            async with self._added:
                while True:
                    for at, event in self.events:
                        if at >= after and event.type == kind and all(getattr(event, k, None) == v
                                                                      for k, v in match.items()):
                            return event
                    if self.closed is not None:
                        raise ConnectionError(f"connection closed before {kind}: {self.closed!r}")
                    await self._added.wait()
        return await asyncio.wait_for(found(), timeout)

    def of_type(self, kind: str) -> list[Any]:
        return [event for _, event in self.events if event.type == kind]

    def time_of(self, event: Any) -> float:
        return next(at for at, seen in self.events if seen is event)

    def audio_of(self, response_id: str) -> np.ndarray:
        chunks = [c.pcm for c in self.audio if c.response_id == response_id]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    def first_audio_at(self, response_id: str) -> float | None:
        """When the response's first loud audio arrived."""
        return next((c.at for c in self.audio if c.response_id == response_id
                     and np.sqrt(np.mean(c.pcm ** 2)) > ONSET_RMS), None)

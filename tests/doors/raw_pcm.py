"""A minimal door plug-in (``duplex serve --door tests.doors.raw_pcm:make_door``), the proof that a
door is one module plus one entry in the list of doors: raw PCM over a WebSocket at ``/pcm``.

The client sends binary int16 mono PCM at the session's input rate; it gets the agent's audio
back as binary int16 mono frames at that rate, one per frame period (silence when the agent is
quiet), and the text ``{"type": "clear"}`` when a barge-in cuts the agent (``AudioClear.CUT``):
frames and the clear share one outbox, so everything after the clear was pulled after the cut."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass

import msgspec
import numpy as np
from fastapi import APIRouter, WebSocket

from duplex.audio import SESSION_RATE
from duplex.edge.plugin import DoorContext
from duplex.session.door import AudioClear, SimpleDoor
from duplex.session.manager import SessionManager, SessionsFull
from duplex.session.pacing import FramePacer
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.session import VoiceSession

PATH = "/pcm"
TRANSPORT = "raw_pcm"
OUTPUT = OutputFormat(sample_rate=SESSION_RATE, channels=1, frame_ms=20)


class Clear(msgspec.Struct, tag_field="type", tag="clear"):
    """Drop the agent audio you have not played yet: the caller barged in."""


CLEAR = msgspec.json.encode(Clear()).decode()


@dataclass
class Counters:
    connected: int = 0
    refused: int = 0  # the server was full
    frames_sent: int = 0
    clears_sent: int = 0


class RawPcmDoor:
    name = TRANSPORT

    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions
        self.live: set[WebSocket] = set()
        self.counters = Counters()

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_websocket_route(PATH, self.serve)
        return router

    async def start(self) -> None:
        """Nothing to open beyond the route."""

    async def close(self) -> None:
        for ws in list(self.live):  # each connection's handler then closes its session
            with contextlib.suppress(RuntimeError):
                await ws.close(1001)

    def stats(self) -> dict:
        return {"live_connections": len(self.live), **asdict(self.counters)}

    async def serve(self, ws: WebSocket) -> None:
        await ws.accept()
        outbox: asyncio.Queue[bytes | str] = asyncio.Queue()

        def clear(why: AudioClear) -> None:
            if why is AudioClear.CUT:  # a pause resumes from the session's playout: nothing to drop
                outbox.put_nowait(CLEAR)
                self.counters.clears_sent += 1

        try:
            session = self.sessions.open(SimpleDoor(TRANSPORT, OUTPUT, _no_events, clear))
        except SessionsFull as exc:
            self.counters.refused += 1
            await ws.close(1013, str(exc)[:120])
            return
        self.counters.connected += 1
        self.live.add(ws)
        tasks = [asyncio.create_task(self._play(session, outbox)), asyncio.create_task(self._write(ws, outbox))]
        try:
            await self._read(ws, session)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.live.discard(ws)
            await self.sessions.close(session)

    async def _read(self, ws: WebSocket, session: VoiceSession) -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data:  # text from the client means nothing to this door
                session.push_input(np.frombuffer(data[:len(data) // 2 * 2], np.int16), time.monotonic())

    async def _play(self, session: VoiceSession, outbox: asyncio.Queue[bytes | str]) -> None:
        async def tick(due: float) -> None:
            outbox.put_nowait(session.pull_output(due).tobytes())

        await FramePacer(OUTPUT.frame_ms / 1000).run(tick)

    async def _write(self, ws: WebSocket, outbox: asyncio.Queue[bytes | str]) -> None:
        while True:
            item = await outbox.get()
            if isinstance(item, str):
                await ws.send_text(item)
            else:
                await ws.send_bytes(item)
                self.counters.frames_sent += 1


def _no_events(event: ev.ServerEvent) -> None:
    """Raw PCM has no event channel: the session's events go nowhere."""


def make_door(context: DoorContext) -> RawPcmDoor:
    return RawPcmDoor(context.sessions)

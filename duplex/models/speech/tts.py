"""The Wyoming TTS stage (``stream`` scheduler): the reply's text goes to a Wyoming TTS server
(Piper's, ...) phrase by phrase as the thinker streams it, and the audio comes back chunk by
chunk as the server sends it.

Phrases are cut as the in-process TTS cuts them (``contract.PhraseSplitter``: the first at
"Sure," so the first audio comes early) and each goes out as one ``synthesize`` on the request's
one connection, without waiting for the audio of the one before (the server answers them in
order, one ``audio-start`` .. ``audio-stop`` each). The first chunk of a phrase carries the phrase
(``AgentAudio.text``: what the caller heard of a cut reply). Chunks keep the server's rate; the
session's playout resamples. An abort (barge-in) cancels the request's task: the connection is
closed at once and the server stops streaming into it.

The voice is the request's (``session.update`` ``voice``), checked against the voices the server
offers (``describe`` -> ``info``, asked once and again when a voice is not found); unknown, the
request fails with a message naming them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from duplex.models.speech import phrasing
from duplex.models.speech.client import Connection, Endpoint, ServiceError, chunk_samples
from duplex.models.speech.phrasing import Start, TTSSettings
from duplex.runtime.contract import AgentAudio, Request, WorkItem

__all__ = ["TTSSettings", "WyomingTTS"]

log = logging.getLogger("duplex.wyoming")
_LISTED = 256  # voices named in an unknown-voice error (Piper offers its whole catalog: 174)


class WyomingTTS:
    def __init__(self, endpoint: Endpoint, settings: TTSSettings) -> None:
        self.endpoint, self.settings = endpoint, settings
        self._voices: tuple[str, ...] | None = None
        self._streams = 0  # connections open now (stats: a barge-in closes its stream at once)

    def held(self) -> dict[str, int]:
        return {"open_streams": self._streams}

    async def run(self, request_id: str, request: Request, inputs: AsyncIterator[WorkItem]) -> AsyncIterator[Any]:
        turn = await phrasing.turn_to_voice(request, inputs)
        if turn is None:
            return
        if turn.voice:
            await self._check_voice(turn.voice)
        phrases: asyncio.Queue[str | None] = asyncio.Queue()
        connection: Connection | None = None
        sender: asyncio.Task[None] | None = None
        try:
            start = await phrasing.first_phrase(self.settings, inputs)
            if start is None:
                return  # the reply had nothing speakable
            connection = await self._open()
            sender = asyncio.create_task(self._send(connection, turn.voice, start, inputs, phrases))
            async for audio in self._receive(connection, phrases, sender):
                yield audio
            await sender
        finally:  # the stream is closed first: a cancel (barge-in) may land at any await below
            if connection is not None:
                self._streams -= 1
                await connection.close()
                log.debug("request %s: tts stream to %s closed", request_id, self.endpoint.url)
            if sender is not None:  # collected even when done: its fault may be the one not raised
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)

    async def _open(self) -> Connection:
        connection = await Connection.open(self.endpoint, self.settings.connect_timeout_s,
                                           self.settings.stall_timeout_s)
        self._streams += 1
        return connection

    async def _send(self, connection: Connection, voice: str, start: Start, inputs: AsyncIterator[WorkItem],
                    phrases: asyncio.Queue[str | None]) -> None:
        """Send each phrase as it is cut, in order, telling the reader; then the end marker (None)."""
        wanted = SynthesizeVoice(name=voice) if voice else None
        for text in start.phrases:
            await connection.send(Synthesize(text=text, voice=wanted))
            phrases.put_nowait(text)
        if not start.ended:
            async for item in inputs:
                for text in phrasing.phrases(start.splitter, item):
                    await connection.send(Synthesize(text=text, voice=wanted))
                    phrases.put_nowait(text)
        phrases.put_nowait(None)

    async def _receive(self, connection: Connection, phrases: asyncio.Queue[str | None],
                       sender: asyncio.Task[None]) -> AsyncIterator[AgentAudio]:
        """Each phrase's audio, in order, as the server streams it."""
        voiced_any = False
        while True:
            phrase = await phrasing.next_phrase(phrases, sender)
            if phrase is None:
                return
            text = phrase if not voiced_any else " " + phrase
            async for samples, rate in self._phrase_audio(connection):
                voiced_any = True
                yield AgentAudio(samples, rate, text)
                text = ""

    async def _phrase_audio(self, connection: Connection) -> AsyncIterator[tuple[Any, int]]:
        rate = None
        while True:
            event = await connection.receive()
            if AudioStart.is_type(event.type):
                rate = AudioStart.from_event(event).rate
            elif AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                if rate is not None and chunk.rate != rate:
                    raise ServiceError(f"{connection.where} changed the audio rate mid-phrase ({rate} -> "
                                       f"{chunk.rate} Hz)")
                samples = chunk_samples(chunk, connection.where)
                if samples.size:
                    yield samples, chunk.rate
            elif AudioStop.is_type(event.type):
                return

    async def _check_voice(self, voice: str) -> None:
        if self._voices is None or voice not in self._voices:
            self._voices = await self.voices()
        if voice not in self._voices:
            listed = ", ".join(self._voices[:_LISTED]) + (f", ... ({len(self._voices)} in all)"
                                                          if len(self._voices) > _LISTED else "")
            raise ValueError(f"voice {voice!r} is not offered by the tts server at {self.endpoint.url}; "
                             f"it offers: {listed or 'no voices'}")

    async def voices(self) -> tuple[str, ...]:
        """The names of the voices the server offers (``describe``), its installed ones first."""
        connection = await Connection.open(self.endpoint, self.settings.connect_timeout_s,
                                           self.settings.stall_timeout_s)
        try:
            await connection.send(Describe())
            while not Info.is_type((event := await connection.receive()).type):
                pass
            info = Info.from_event(event)
        finally:
            await connection.close()
        voices = [voice for program in info.tts for voice in program.voices]
        installed = [voice.name for voice in voices if voice.installed]
        return tuple(installed + [voice.name for voice in voices if not voice.installed])


"""The Wyoming ASR stage (``stream`` scheduler): the caller's audio goes to a Wyoming ASR server
(faster-whisper's, ...) as it arrives: ``transcribe``, ``audio-start``, ``audio-chunk``s and, at
the end of the turn, ``audio-stop`` -> its ``transcript``, the turn's final ``Transcript``.

Such a server sends only final transcripts, so this stage makes the requests the session needs,
keeping the contract the in-process ASR keeps (``local.asr.StreamingASR``; the session cannot
tell them apart):

- at a settled pause (``settle_s`` of the session's unvoiced frames after new speech: where
  semantic turns judge a pause) the audio so far is transcribed on a second connection and
  sent as an interim ``Transcript(final=False)``: a speculative final;
- at the end of the turn, when nothing was said since that interim, it is the final (no wait
  for the server); else the streamed connection's ``audio-stop`` gives the final;
- an ``OverlapProbe`` (the listening barge-in's question) is served the same way: its audio in,
  its words out.

A turn with no voiced frame is an empty final without a server call; a typed turn
(``TurnRequest.text``) is its own final. If the streamed connection fails mid-turn (the server
died, was restarted), the final is asked once more on a new connection with the turn's whole
audio; if that fails too, the request fails with the server's error (the caller's ``error``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from wyoming.asr import Transcribe
from wyoming.asr import Transcript as WyomingTranscript
from wyoming.audio import AudioChunk, AudioStart, AudioStop

from duplex.models.speech.client import Connection, Endpoint, ServiceError, pcm16
from duplex.runtime.contract import SESSION_RATE, CallerAudio, Request, SessionEnd, Transcript, TurnRequest, WorkItem


@dataclass(frozen=True)
class ASRSettings:
    connect_timeout_s: float = 3.0
    stall_timeout_s: float = 10.0  # a write the server does not take for this long
    transcript_timeout_s: float = 20.0  # audio-stop -> transcript
    settle_s: float = 0.1  # unvoiced audio after new speech that makes a speculative final (as local.yaml)
    min_speech_s: float = 0.09  # voiced audio that counts as "speech happened"
    language: str | None = "en"


@dataclass
class _Turn:
    """One request's audio and what is known of its words."""

    audio: list[np.ndarray] = field(default_factory=list)
    voiced: list[bool] = field(default_factory=list)
    samples: int = 0
    frame: int = SESSION_RATE // 50  # samples per voice decision
    covered: int = 0  # frames the interim text covers
    interim: Transcript | None = None  # the speculative final's words
    last_voiced: int = -1  # index of the last voiced frame
    finished: bool = False  # the final is out: no interim may follow it

    def add(self, chunk: CallerAudio) -> np.ndarray:
        samples = np.asarray(chunk.samples, np.float32).reshape(-1)
        self.frame = SESSION_RATE * chunk.frame_ms // 1000
        for flag in chunk.voiced:
            if flag:
                self.last_voiced = len(self.voiced)
            self.voiced.append(flag)
        self.audio.append(samples)
        self.samples += len(samples)
        return samples

    def whole(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


class ServerASR:
    """What every ASR that calls a server does (see the module's doc); a transport says how the
    audio reaches its server: ``_transcribe`` (a whole clip, one request) and, where the
    protocol streams, ``_start_stream`` / ``_stream`` / ``_finish_stream``."""

    def __init__(self, settings: ASRSettings) -> None:
        self.settings = settings
        self._streams = 0
        self.calls = 0  # transcripts asked of the server (benchmarks and tests read it)

    def held(self) -> dict[str, int]:
        return {"open_streams": self._streams}

    async def run(self, request_id: str, request: Request, inputs: AsyncIterator[WorkItem]) -> AsyncIterator[Any]:
        if isinstance(request, SessionEnd):
            async for _ in inputs:
                pass
            return
        if isinstance(request, TurnRequest) and request.text is not None:  # a typed turn
            async for _ in inputs:
                pass
            yield Transcript(request.text, final=True)
            return
        out: asyncio.Queue[Transcript | BaseException | None] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(inputs, out))
        try:
            while (item := await out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump(self, inputs: AsyncIterator[WorkItem], out: asyncio.Queue) -> None:
        turn = _Turn()
        stream: Any = None
        speculative: asyncio.Task[None] | None = None
        ended: ServiceError | ValueError | None = None
        try:
            stream = await self._start_stream()
            async for item in inputs:
                if item.data is not None and not isinstance(item.data, CallerAudio):
                    raise ValueError(f"asr input needs CallerAudio, got {type(item.data).__name__}")
                if item.data is not None:
                    stream = await self._stream(stream, pcm16(turn.add(item.data)))
                if item.eos:
                    words = await self._final(turn, stream, speculative)
                    turn.finished = True
                    out.put_nowait(words)
                elif self._settled(turn):
                    if speculative is not None:
                        speculative.cancel()
                    # said now, not when the task first runs: a later pause needs new speech past this one
                    turn.covered, turn.interim = len(turn.voiced), None
                    speculative = asyncio.create_task(self._speculate(turn, turn.whole(), out))
        except (ServiceError, ValueError) as exc:
            ended = exc
        finally:  # closed before anything is awaited: a cancel (the reader gone) may land at any await
            if stream is not None:
                await self._close_stream(stream)
            if speculative is not None:
                speculative.cancel()
                await asyncio.gather(speculative, return_exceptions=True)
        out.put_nowait(ended)  # None: the request's end

    async def _final(self, turn: _Turn, stream: Connection | None,
                     speculative: asyncio.Task[None] | None) -> Transcript:
        if turn.last_voiced < 0 or sum(turn.voiced) * turn.frame < self.settings.min_speech_s * SESSION_RATE:
            return Transcript("", final=True)  # nothing was said (Whisper makes words up from silence)
        if speculative is not None and turn.last_voiced < turn.covered:
            await asyncio.gather(speculative, return_exceptions=True)  # it covers every voiced frame
            if turn.interim is not None:
                return turn.interim
        if stream is not None:
            try:
                return await self._finish_stream(stream)
            except ServiceError:
                pass  # asked again below, on a new connection
        return await self._transcribe(turn.whole())

    # -- one-shot transcriptions ----------------------------------------------------------------
    def _settled(self, turn: _Turn) -> bool:
        """New speech since the interim, then ``settle_s`` of silence: a pause to transcribe."""
        settle = math.ceil(self.settings.settle_s * SESSION_RATE / turn.frame)
        new = turn.voiced[turn.covered:]
        return len(new) >= settle and not any(new[-settle:]) and \
            sum(new) * turn.frame >= self.settings.min_speech_s * SESSION_RATE

    async def _speculate(self, turn: _Turn, audio: np.ndarray, out: asyncio.Queue) -> None:
        try:
            words = await self._transcribe(audio)
        except ServiceError:
            return  # a speculative final is a luxury: the end of the turn asks again
        turn.interim = words
        if words.text and not turn.finished:
            out.put_nowait(msgspec.structs.replace(words, final=False))

    # -- the transport (a server that only takes whole clips needs only ``_transcribe``): each
    # answers a final ``Transcript``, with the server's confidence in it where it gives one -------
    async def _start_stream(self) -> Any:
        """The turn's streamed request, or None (then the final is one ``_transcribe``)."""
        return None

    async def _stream(self, stream: Any, pcm: bytes) -> Any:
        return stream

    async def _finish_stream(self, stream: Any) -> Transcript:
        raise ServiceError("this transport streams nothing")

    async def _close_stream(self, stream: Any) -> None:
        pass

    async def _transcribe(self, audio: np.ndarray) -> Transcript:
        raise NotImplementedError


class WyomingASR(ServerASR):
    """Wyoming over TCP: the turn's audio streamed on one connection as it arrives."""

    def __init__(self, endpoint: Endpoint, settings: ASRSettings) -> None:
        super().__init__(settings)
        self.endpoint = endpoint

    async def _start_stream(self) -> Connection | None:
        """The turn's streamed connection; None when the server cannot be reached now (the final
        is asked again at the end of the turn)."""
        try:
            connection = await self._open()
        except ServiceError:
            return None
        try:
            await connection.send(Transcribe(language=self.settings.language))
            await connection.send(AudioStart(rate=SESSION_RATE, width=2, channels=1))
        except ServiceError:
            await self._close(connection)
            return None
        return connection

    async def _stream(self, stream: Connection | None, pcm: bytes) -> Connection | None:
        if stream is None or not pcm:
            return stream
        try:
            await stream.send(AudioChunk(rate=SESSION_RATE, width=2, channels=1, audio=pcm))
            return stream
        except ServiceError:  # it died: the end of the turn asks again with the whole audio
            await self._close(stream)
            return None

    async def _finish_stream(self, stream: Connection) -> Transcript:
        await stream.send(AudioStop())
        return await self._transcript(stream)

    async def _close_stream(self, stream: Connection) -> None:
        await self._close(stream)

    async def _transcribe(self, audio: np.ndarray) -> Transcript:
        connection = await self._open()
        try:
            await connection.send(Transcribe(language=self.settings.language))
            await connection.send(AudioStart(rate=SESSION_RATE, width=2, channels=1))
            step = SESSION_RATE // 10
            for start in range(0, len(audio), step):
                await connection.send(AudioChunk(rate=SESSION_RATE, width=2, channels=1,
                                                 audio=pcm16(audio[start:start + step])))
            await connection.send(AudioStop())
            return await self._transcript(connection)
        finally:
            await self._close(connection)

    async def _transcript(self, connection: Connection) -> Transcript:
        """The server's transcript (Wyoming's says nothing of its confidence)."""
        self.calls += 1
        while True:
            event = await connection.receive(self.settings.transcript_timeout_s)
            if WyomingTranscript.is_type(event.type):
                return Transcript(" ".join(WyomingTranscript.from_event(event).text.split()), final=True)

    async def _open(self) -> Connection:
        connection = await Connection.open(self.endpoint, self.settings.connect_timeout_s,
                                           self.settings.stall_timeout_s)
        self._streams += 1
        return connection

    async def _close(self, connection: Connection) -> None:
        if not connection.closed:
            self._streams -= 1
        await connection.close()  # its socket is closed before this first awaits

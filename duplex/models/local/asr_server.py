"""`duplex model asr-server`: the local pipeline's recogniser (Whisper-base, CTranslate2 int8,
its encoder window fitted to the utterance) served over the Wyoming protocol, so that an engine
pool of duplex's own can hear for duplex replicas on other machines (``duplex serve --asr
tcp://HOST:PORT``), or for anything else that speaks Wyoming (Home Assistant).

A Wyoming ASR server that pads every request to Whisper's 30 s window (wyoming-faster-whisper,
faster-whisper-server) pays for 30 s of encoder per transcript; this one pays for the utterance,
as the in-process stage does (``asr`` module doc). Requests from all connections meet in one
queue and are transcribed in batches of one window length on one worker thread, so many callers'
finals share encoder calls as they do in process.

Per connection: ``describe`` -> ``info``; ``transcribe`` (its language must be the model's),
``audio-start``, ``audio-chunk``s (16-bit mono, any rate: resampled to 16 kHz), ``audio-stop``
-> ``transcript``. Audio past ``max_audio_s`` or in another sample width is an ``error`` event
naming what was wrong, and the connection is closed; other connections are not touched.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info
from wyoming.server import AsyncEventHandler, AsyncServer

from duplex.audio import resample
from duplex.models.local import assets
from duplex.models.local.asr import SAMPLE_RATE, StreamingPolicy, WhisperTranscriber, window_frames

log = logging.getLogger("duplex.asr_server")
LANGUAGE = "en"
MIN_RATE, MAX_RATE = 8000, 48000
MAX_AUDIO_S = 120.0  # one request's audio; a turn is seconds, a stuck stream is not a turn


@dataclass
class _Job:
    audio: np.ndarray
    done: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class BatchedTranscriber:
    """The one model: queued requests, transcribed in batches that share a window length. Audio
    longer than the policy's ``commit_after_s`` is transcribed piece by piece (Whisper sees at
    most 30 s), the pieces' words joined."""

    def __init__(self, transcriber: WhisperTranscriber, policy: StreamingPolicy, max_batch: int = 8) -> None:
        self.transcriber, self.policy, self.max_batch = transcriber, policy, max_batch
        self.calls = 0
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()

    async def transcribe(self, audio: np.ndarray) -> str:
        piece = int(self.policy.commit_after_s * SAMPLE_RATE)
        jobs = [_Job(audio[start:start + piece]) for start in range(0, max(len(audio), 1), piece)]
        for job in jobs:
            self._queue.put_nowait(job)
        texts = [await job.done for job in jobs]
        return " ".join(text for text in texts if text)

    async def run(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            while len(jobs) < self.max_batch and not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            groups: dict[int, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(window_frames(len(job.audio) / SAMPLE_RATE, self.policy), []).append(job)
            for window, group in groups.items():
                await self._transcribe_group(window, group)

    async def _transcribe_group(self, window: int, group: list[_Job]) -> None:
        live = [job for job in group if not job.done.done()]  # a request whose caller left is skipped
        if not live:
            return
        try:
            texts = await asyncio.to_thread(self.transcriber.transcribe, [job.audio for job in live], window)
        except Exception as exc:  # the model failed this batch: its requests get the error, the server goes on
            log.exception("transcription failed")
            for job in live:
                if not job.done.done():
                    job.done.set_exception(exc)
            return
        self.calls += 1
        for job, text in zip(live, texts):
            if not job.done.done():
                job.done.set_result(text)


class _Connection(AsyncEventHandler):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, model: BatchedTranscriber,
                 info: Info, max_audio_s: float) -> None:
        super().__init__(reader, writer)
        self.model, self.info, self.max_audio_s = model, info, max_audio_s
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._rate: int | None = None

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.info.event())
        elif Transcribe.is_type(event.type):
            language = Transcribe.from_event(event).language
            if language not in (None, LANGUAGE):
                return await self._refuse(f"language {language!r}: this server hears {LANGUAGE!r} only")
        elif AudioStart.is_type(event.type):
            self._chunks, self._samples, self._rate = [], 0, None
        elif AudioChunk.is_type(event.type):
            return await self._add(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
            self._chunks, self._samples = [], 0
            text = await self.model.transcribe(audio) if audio.size else ""
            await self.write_event(Transcript(text=text).event())
        return True

    async def _add(self, chunk: AudioChunk) -> bool:
        if chunk.width != 2 or chunk.channels != 1:
            return await self._refuse(f"audio of width {chunk.width} and {chunk.channels} channel(s): "
                                      "this server takes 16-bit mono")
        if not MIN_RATE <= chunk.rate <= MAX_RATE:
            return await self._refuse(f"audio at {chunk.rate} Hz: this server takes {MIN_RATE}-{MAX_RATE} Hz")
        if self._rate is not None and chunk.rate != self._rate:
            return await self._refuse(f"the audio rate changed mid-stream ({self._rate} -> {chunk.rate} Hz)")
        self._rate = chunk.rate
        samples = np.frombuffer(chunk.audio, dtype="<i2").astype(np.float32) / 32768.0
        samples = resample(samples, chunk.rate, SAMPLE_RATE) if chunk.rate != SAMPLE_RATE else samples
        self._samples += len(samples)
        if self._samples > self.max_audio_s * SAMPLE_RATE:
            return await self._refuse(f"more than {self.max_audio_s:.0f} s of audio in one request")
        self._chunks.append(samples)
        return True

    async def _refuse(self, why: str) -> bool:
        log.warning("refused a request: %s", why)
        await self.write_event(Error(text=why, code="bad-request").event())
        return False  # the connection ends; the others go on


def server_info() -> Info:
    model = AsrModel(name="whisper-base", description="Whisper-base, CTranslate2 int8, fitted window",
                     attribution=Attribution(name="OpenAI", url="https://github.com/openai/whisper"),
                     installed=True, languages=[LANGUAGE], version=None)
    program = AsrProgram(name="duplex", description="duplex's local recogniser",
                         attribution=Attribution(name="duplex", url=""), installed=True,
                         models=[model], version=None)
    return Info(asr=[program])


async def serve(uri: str, model: BatchedTranscriber, max_audio_s: float = MAX_AUDIO_S) -> None:
    server = AsyncServer.from_uri(uri)
    info = server_info()
    worker = asyncio.create_task(model.run())
    try:
        print(f"duplex asr server: Wyoming on {uri}", flush=True)
        await server.run(lambda reader, writer: _Connection(reader, writer, model, info, max_audio_s))
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("asr-server", help="serve the local recogniser (Whisper-base) over Wyoming")
    parser.add_argument("--uri", default="tcp://127.0.0.1:10300", help="where to listen (tcp://HOST:PORT)")
    parser.add_argument("--threads", type=int, default=2, help="the model's CPU threads")
    parser.add_argument("--hint", default="", help="words the recogniser should expect (Whisper's previous text)")
    parser.add_argument("--max-audio-s", type=float, default=MAX_AUDIO_S, help="the longest request")
    parser.add_argument("--cache-dir", help="where prepared models live (as prepare-local)")
    parser.set_defaults(func=run, takes_overrides=False)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.threads < 1 or args.max_audio_s <= 0:
        print("error: --threads must be at least 1 and --max-audio-s above 0")
        return 2
    model_dir = assets.prepare_whisper(Path(args.cache_dir).expanduser() if args.cache_dir else None)
    model = BatchedTranscriber(WhisperTranscriber(model_dir, threads=args.threads, hint=args.hint), StreamingPolicy())
    try:
        asyncio.run(serve(args.uri, model, args.max_audio_s))
    except KeyboardInterrupt:
        pass
    return 0

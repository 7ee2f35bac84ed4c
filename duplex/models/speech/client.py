"""One Wyoming connection: Home Assistant's speech protocol over TCP (JSON header lines, each with
optional data and a binary payload). The ``wyoming`` package gives the event types; the reading
here is our own, so a server that sends garbage, stalls or hangs up is told apart and named
(``ServiceError``, whose message becomes the caller's ``error`` event) instead of reading as
a clean end.

A connection serves one request (one synthesis stream, one transcription): a server that died
and came back is simply reached again by the next request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
from wyoming.audio import AudioChunk
from wyoming.error import Error
from wyoming.event import Event, Eventable, async_write_event

MAX_LINE = 64 * 1024  # a header line; one longer is garbage
MAX_BODY = 16 * 2**20  # data + payload of one event (an audio chunk is a few kB)
MIN_RATE, MAX_RATE = 8000, 48000  # audio rates a TTS server may send


class ServiceError(RuntimeError):
    """The speech server failed this request (refused, stalled, hung up, sent garbage)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a speech server listens; ``what`` names it in errors ("asr server")."""

    host: str
    port: int
    what: str

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def parse_url(url: str, what: str) -> Endpoint:
    """``tcp://HOST:PORT`` (Wyoming). ``http(s)://`` is an OpenAI-compatible server's: the
    ``openai.*`` builders', not a Wyoming stage's."""
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        raise ValueError(f"{what} {url!r}: an OpenAI-compatible server (http(s)://) is for the openai.asr / "
                         f"openai.tts builders; a Wyoming stage needs tcp://HOST:PORT")
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(f"{what} {url!r}: expected tcp://HOST:PORT (a Wyoming server)")
    return Endpoint(parts.hostname, parts.port, what)


class Connection:
    """One open connection to a Wyoming server; every failure is a ``ServiceError``."""

    def __init__(self, endpoint: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 stall_timeout_s: float) -> None:
        self.endpoint, self._reader, self._writer = endpoint, reader, writer
        self.stall_timeout_s = stall_timeout_s
        self.closed = False

    @classmethod
    async def open(cls, endpoint: Endpoint, connect_timeout_s: float, stall_timeout_s: float) -> Connection:
        where = f"{endpoint.what} at {endpoint.url}"
        try:
            async with asyncio.timeout(connect_timeout_s):
                reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, limit=MAX_LINE)
        except ConnectionRefusedError:
            raise ServiceError(f"{where} refused the connection (is it running?)") from None
        except TimeoutError:
            raise ServiceError(f"{where}: no connection within {connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ServiceError(f"{where}: cannot connect ({exc.strerror or exc})") from None
        return cls(endpoint, reader, writer, stall_timeout_s)

    @property
    def where(self) -> str:
        return f"{self.endpoint.what} at {self.endpoint.url}"

    async def send(self, message: Eventable | Event) -> None:
        event = message if isinstance(message, Event) else message.event()
        try:
            async with asyncio.timeout(self.stall_timeout_s):
                await async_write_event(event, self._writer)
        except TimeoutError:
            raise ServiceError(f"{self.where} took no data for {self.stall_timeout_s:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise ServiceError(f"{self.where} hung up ({type(exc).__name__})") from None

    async def receive(self, timeout_s: float | None = None) -> Event:
        """The next event; an ``error`` event from the server is raised as a ``ServiceError``."""
        wait = self.stall_timeout_s if timeout_s is None else timeout_s
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel (a barge-in's
            # abort) that lands as the read completes, and the stream would play on to its end
            async with asyncio.timeout(wait):
                event = await self._read()
        except TimeoutError:
            raise ServiceError(f"{self.where} sent nothing for {wait:g} s (stalled)") from None
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise ServiceError(f"{self.where} hung up mid-answer ({type(exc).__name__})") from None
        except (ValueError, KeyError, TypeError, asyncio.LimitOverrunError):  # json's errors are ValueErrors
            raise ServiceError(f"{self.where} sent something that is not a Wyoming event") from None
        if Error.is_type(event.type):
            raise ServiceError(f"{self.where} says: {Error.from_event(event).text}")
        return event

    async def _read(self) -> Event:
        line = await self._reader.readline()
        if not line:
            raise ServiceError(f"{self.where} closed the connection mid-answer")
        header = json.loads(line)
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise ValueError("no event type")
        data = header.get("data") or {}
        data_length, payload_length = int(header.get("data_length") or 0), int(header.get("payload_length") or 0)
        if not isinstance(data, dict) or not 0 <= data_length + payload_length <= MAX_BODY or data_length < 0:
            raise ValueError("bad event lengths")
        if data_length:
            extra = json.loads(await self._reader.readexactly(data_length))
            if not isinstance(extra, dict):
                raise ValueError("event data is not an object")
            data.update(extra)
        payload = await self._reader.readexactly(payload_length) if payload_length else None
        return Event(type=header["type"], data=data, payload=payload)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._writer.close()
        try:
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            pass  # closed on our side either way


def pcm16(samples: np.ndarray) -> bytes:
    """Float32 mono -> 16-bit little-endian PCM (what Wyoming's audio chunks carry)."""
    return (np.clip(np.asarray(samples, np.float32), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def chunk_samples(chunk: AudioChunk, where: str) -> np.ndarray:
    """A server's audio chunk as float32 mono; a format we cannot play is the server's error."""
    if not MIN_RATE <= chunk.rate <= MAX_RATE or chunk.width != 2 or chunk.channels != 1:
        raise ServiceError(f"{where} sent audio we cannot play (rate {chunk.rate}, width {chunk.width}, "
                           f"channels {chunk.channels}; expected 16-bit mono at {MIN_RATE}-{MAX_RATE} Hz)")
    if len(chunk.audio) % 2:
        raise ServiceError(f"{where} sent an audio chunk of odd length ({len(chunk.audio)} bytes of 16-bit audio)")
    return np.frombuffer(chunk.audio, "<i2").astype(np.float32) / 32768.0

"""The OpenAI-compatible TTS stage (``stream`` scheduler): each phrase of the reply is one
``POST {base_url}/audio/speech`` with ``{"model", "input", "voice", "response_format"}``, as
OpenAI's API, Kokoro-FastAPI, local-tts-studio and other Piper servers answer it, and the
audio is read back chunk by chunk as the response streams.

``response_format: pcm`` (the default) is raw 16-bit little-endian mono at ``pcm_rate`` (OpenAI
sends 24 kHz); ``wav`` is for servers that only give that, and the rate is read from the WAV
header. Phrases are cut as ``wyoming.tts`` cuts them (``phrasing``): the first at "Sure,", each
as soon as it is cut, their requests one after another on the request's task (a phrase's audio
is all read before the next phrase is asked for, so it plays in order; the next is asked for long
before this one has played out). The first chunk of a phrase carries the phrase. An abort
(barge-in) cancels the task: the open response is closed at once, and with it the connection.

The voice is the request's (``session.update`` ``voice``), else ``voice`` of the args. Where the
server lists its voices (``GET {base_url}/audio/voices``, as Kokoro-FastAPI and loudness-tts
do) an unknown one fails the request naming them; where it cannot, the name goes through as is.
Faults are ``ServiceError``s naming the server, as ``wyoming.tts``'s are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from duplex.models.speech import phrasing
from duplex.models.speech.client import ServiceError
from duplex.models.speech.phrasing import TTSSettings
from duplex.models.speech.speech_audio import audio_decoder
from duplex.runtime.contract import AgentAudio, Request, WorkItem

log = logging.getLogger("duplex.openai_tts")
_LISTED = 256  # voices named in an unknown-voice error
_ERROR_BYTES = 2048  # read of an error answer's body, for its message


@dataclass(frozen=True)
class SpeechFormat:
    """What each request asks for: the server's model name, the voice when the session names
    none, and the audio's encoding."""

    model: str = "tts-1"
    voice: str = "alloy"
    response_format: str = "pcm"  # pcm | wav
    pcm_rate: int = 24000  # the rate of raw pcm (OpenAI's: 24 kHz)


class OpenAITTS:
    def __init__(self, base_url: str, api_key: str, settings: TTSSettings, speech: SpeechFormat) -> None:
        self.base_url, self._api_key = base_url.rstrip("/"), api_key
        self.settings, self.speech = settings, speech
        self._http: httpx.AsyncClient | None = None  # made on the stage's loop, at first use
        self._voices: tuple[str, ...] | None = None  # None: not asked yet
        self._listed = True  # False once the server showed it cannot list voices
        self._streams = 0  # responses open now (stats: a barge-in closes its stream at once)

    @property
    def where(self) -> str:
        return f"tts server at {self.base_url}"

    def held(self) -> dict[str, int]:
        return {"open_streams": self._streams}

    async def run(self, request_id: str, request: Request, inputs: AsyncIterator[WorkItem]) -> AsyncIterator[Any]:
        turn = await phrasing.turn_to_voice(request, inputs)
        if turn is None:
            return
        voice = turn.voice or self.speech.voice
        if turn.voice:
            await self._check_voice(turn.voice)
        start = await phrasing.first_phrase(self.settings, inputs)
        if start is None:
            return  # the reply had nothing speakable
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        cutter = asyncio.create_task(_cut(start, inputs, queue))
        try:
            voiced_any = False
            while (phrase := await phrasing.next_phrase(queue, cutter)) is not None:
                text = phrase if not voiced_any else " " + phrase
                async for samples, rate in self._speak(phrase, voice):
                    voiced_any = True
                    yield AgentAudio(samples, rate, text)
                    text = ""
            await cutter
        finally:
            cutter.cancel()  # collected even when done: its fault may be the one not raised
            await asyncio.gather(cutter, return_exceptions=True)
            log.debug("request %s: tts done with %s", request_id, self.base_url)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self._api_key}"})
        return self._http

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.settings.stall_timeout_s, connect=self.settings.connect_timeout_s)

    async def _speak(self, phrase: str, voice: str) -> AsyncIterator[tuple[np.ndarray, int]]:
        """One phrase's audio, as the response streams it; the response is closed on the way out
        (an abort's cancel included)."""
        body = {"model": self.speech.model, "input": phrase, "voice": voice,
                "response_format": self.speech.response_format}
        self._streams += 1
        try:
            async with self._client().stream("POST", f"{self.base_url}/audio/speech", json=body,
                                             timeout=self._timeout()) as reply:
                await self._check_answer(reply)
                decode = audio_decoder(self.speech.response_format, self.speech.pcm_rate, self.where)
                async for data in reply.aiter_bytes():
                    for samples, rate in decode.push(data):
                        yield samples, rate
                decode.end()
        except httpx.HTTPError as exc:
            raise self._fault(exc) from None
        finally:
            self._streams -= 1

    async def _check_answer(self, reply: httpx.Response) -> None:
        if reply.status_code != 200:
            raise ServiceError(f"{self.where} answered HTTP {reply.status_code}: {await _head(reply)}")
        kind = reply.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind.startswith(("text/", "application/json")):
            raise ServiceError(f"{self.where} sent something that is not audio ({kind}): {await _head(reply)!r}")

    def _fault(self, exc: httpx.HTTPError) -> ServiceError:
        if isinstance(exc, httpx.ConnectError):
            return ServiceError(f"{self.where} refused the connection (is it running?)")
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            return ServiceError(f"{self.where}: no connection within {self.settings.connect_timeout_s:g} s")
        if isinstance(exc, httpx.TimeoutException):
            return ServiceError(f"{self.where} sent nothing for {self.settings.stall_timeout_s:g} s (stalled)")
        return ServiceError(f"{self.where} hung up mid-answer ({type(exc).__name__})")

    async def _check_voice(self, voice: str) -> None:
        if self._listed and (self._voices is None or voice not in self._voices):
            listed = await self.voices()
            self._listed, self._voices = listed is not None, listed
        if self._voices is None or voice in self._voices:
            return  # offered, or the server cannot say: the name goes through
        names = ", ".join(self._voices[:_LISTED]) + (f", ... ({len(self._voices)} in all)"
                                                     if len(self._voices) > _LISTED else "")
        raise ValueError(f"voice {voice!r} is not offered by the {self.where}; it offers: {names or 'no voices'}")

    async def voices(self) -> tuple[str, ...] | None:
        """The voices the server lists at ``GET /audio/voices``, or None where it lists none
        (OpenAI's API itself has no such list)."""
        try:
            reply = await self._client().get(f"{self.base_url}/audio/voices", timeout=self._timeout())
        except httpx.HTTPError as exc:
            raise self._fault(exc) from None
        if reply.status_code != 200:
            return None
        try:
            return voice_names(reply.json())
        except ValueError:
            return None  # not JSON: a web page where the list would be


def voice_names(listing: Any) -> tuple[str, ...] | None:
    """The names in a voice list as the servers give it: ``{"voices": [...]}`` (Kokoro-FastAPI),
    ``{"data": [{"id": ...}]}`` (loudness-tts) or a bare list; each entry a name or an object
    with ``id`` / ``name`` / ``voice_id``. None when it is none of these, or only a page of the
    list (a ``total`` larger than the page: loudness-tts sends 100 of its 1,683 unless asked)."""
    entries = listing.get("voices", listing.get("data")) if isinstance(listing, dict) else listing
    if not isinstance(entries, list):
        return None
    total = listing.get("total") if isinstance(listing, dict) else None
    if isinstance(total, int) and total > len(entries):
        return None  # a page: a voice not on it may still be offered
    names = []
    for entry in entries:
        name = entry if isinstance(entry, str) else next(
            (entry[key] for key in ("id", "name", "voice_id") if isinstance(entry, dict)
             and isinstance(entry.get(key), str)), None)
        if name is None:
            return None
        names.append(name)
    return tuple(names)


async def _cut(start: phrasing.Start, inputs: AsyncIterator[WorkItem], queue: asyncio.Queue[str | None]) -> None:
    """Hand on each phrase as it is cut, in order; then the end marker (None)."""
    for text in start.phrases:
        queue.put_nowait(text)
    if not start.ended:
        async for item in inputs:
            for text in phrasing.phrases(start.splitter, item):
                queue.put_nowait(text)
    queue.put_nowait(None)


async def _head(reply: httpx.Response) -> str:
    """The start of a response's body (an error's message), read no further than that."""
    data = b""
    async for piece in reply.aiter_bytes():
        data += piece
        if len(data) >= _ERROR_BYTES:
            break
    return data[:_ERROR_BYTES].decode("utf-8", "replace").strip()[:300]

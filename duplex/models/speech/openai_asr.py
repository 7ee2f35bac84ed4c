"""The OpenAI-compatible ASR transport: ``POST {base_url}/audio/transcriptions`` (multipart: the
clip as a 16 kHz WAV, ``model``, ``language``, ``response_format=json``) -> ``{"text": ...}``, as
OpenAI's API, vLLM serving Whisper and faster-whisper-server answer it.

Such a server takes whole clips, so nothing streams while the caller speaks: the speculative
final at a pause and the final at the end of the turn are one request each, with the turn's audio
so far (``asr.ServerASR`` decides when). Failures are ``ServiceError``s naming the server: a
refused connection, no answer within ``transcript_timeout_s``, an HTTP error with the server's
message, a body that is not a transcription.
"""

from __future__ import annotations

import io
import wave

import httpx
import numpy as np

from duplex.models.speech.asr import ASRSettings, ServerASR
from duplex.models.speech.client import ServiceError, pcm16
from duplex.runtime.contract import SESSION_RATE


def wav_bytes(audio: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SESSION_RATE)
        out.writeframes(pcm16(audio))
    return buffer.getvalue()


class OpenAIASR(ServerASR):
    def __init__(self, base_url: str, model: str, api_key: str, settings: ASRSettings) -> None:
        super().__init__(settings)
        self.base_url, self.model, self._api_key = base_url.rstrip("/"), model, api_key
        self._http: httpx.AsyncClient | None = None  # made on the stage's loop, at first use

    @property
    def where(self) -> str:
        return f"asr server at {self.base_url}"

    async def _transcribe(self, audio: np.ndarray) -> str:
        if self._http is None:
            self._http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self._api_key}"})
        fields = {"model": self.model, "response_format": "json"}
        if self.settings.language:
            fields["language"] = self.settings.language
        timeout = httpx.Timeout(self.settings.transcript_timeout_s, connect=self.settings.connect_timeout_s)
        self.calls += 1
        self._streams += 1
        try:
            reply = await self._http.post(f"{self.base_url}/audio/transcriptions", data=fields, timeout=timeout,
                                          files={"file": ("turn.wav", wav_bytes(audio), "audio/wav")})
        except httpx.ConnectError:
            raise ServiceError(f"{self.where} refused the connection (is it running?)") from None
        except httpx.TimeoutException:
            raise ServiceError(f"{self.where} sent nothing for {self.settings.transcript_timeout_s:g} s "
                               f"(stalled)") from None
        except httpx.HTTPError as exc:
            raise ServiceError(f"{self.where} hung up mid-answer ({type(exc).__name__})") from None
        finally:
            self._streams -= 1
        return self._text(reply)

    def _text(self, reply: httpx.Response) -> str:
        if reply.status_code != 200:
            raise ServiceError(f"{self.where} answered HTTP {reply.status_code}: {reply.text[:300]}")
        try:
            text = reply.json()["text"]
        except (ValueError, KeyError, TypeError):
            text = None
        if not isinstance(text, str):
            raise ServiceError(f"{self.where} sent something that is not a transcription: {reply.text[:100]!r}")
        return " ".join(text.split())

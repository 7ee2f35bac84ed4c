"""The OpenAI-compatible ASR transport: ``POST {base_url}/audio/transcriptions`` (multipart: the
clip as a 16 kHz WAV, ``model``, ``language``, ``response_format``) -> ``{"text": ...}``, as
OpenAI's API, vLLM serving Whisper and faster-whisper-server answer it.

It asks for ``verbose_json``: Whisper's segments come with their mean log-probability per token
and P(no speech), the confidence the listening barge-in weighs an overlap's words by
(``barge_in.min_logprob``), as the in-process recogniser gives it. A server that refuses that
format (OpenAI's newer transcription models take ``json`` only) is asked for ``json`` from then
on, and its words come without a confidence (every word counts, as before).

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
import msgspec
import numpy as np

from duplex.models.speech.asr import ASRSettings, ServerASR
from duplex.models.speech.client import ServiceError, pcm16
from duplex.runtime.contract import SESSION_RATE, Transcript


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
        self._verbose = True  # ask for segments with their confidence, until the server refuses them

    @property
    def where(self) -> str:
        return f"asr server at {self.base_url}"

    async def _transcribe(self, audio: np.ndarray) -> Transcript:
        reply = await self._post(audio)
        if self._verbose and _refuses_verbose(reply):
            self._verbose = False
            reply = await self._post(audio)
        return self._words(reply)

    async def _post(self, audio: np.ndarray) -> httpx.Response:
        if self._http is None:
            self._http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self._api_key}"})
        fields = {"model": self.model, "response_format": "verbose_json" if self._verbose else "json"}
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
        return reply

    def _words(self, reply: httpx.Response) -> Transcript:
        if reply.status_code != 200:
            raise ServiceError(f"{self.where} answered HTTP {reply.status_code}: {reply.text[:300]}")
        try:
            answer = msgspec.json.decode(reply.content, type=_Transcription)
        except msgspec.MsgspecError:
            raise ServiceError(f"{self.where} sent something that is not a transcription: "
                               f"{reply.text[:100]!r}") from None
        avg_logprob, no_speech_prob = answer.confidence()
        return Transcript(" ".join(answer.text.split()), final=True, avg_logprob=avg_logprob,
                          no_speech_prob=no_speech_prob)


class _Segment(msgspec.Struct):
    """One of ``verbose_json``'s segments: what it says of its confidence (other fields ignored)."""

    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    tokens: list[int] = []


class _Transcription(msgspec.Struct):
    """A transcription: ``json``'s text, and ``verbose_json``'s segments too."""

    text: str
    segments: list[_Segment] = []

    def confidence(self) -> tuple[float | None, float | None]:
        """The clip's mean log-probability per token (its segments', weighted by their tokens)
        and the first segment's P(no speech); None where the server sent no such numbers."""
        scored = [s for s in self.segments if s.avg_logprob is not None]
        if not scored or len(scored) < len(self.segments):  # one segment unscored: unknown
            return None, None
        weights = [max(1, len(s.tokens)) for s in scored]
        mean = sum(w * float(s.avg_logprob or 0.0) for w, s in zip(weights, scored)) / sum(weights)
        return mean, self.segments[0].no_speech_prob


def _refuses_verbose(reply: httpx.Response) -> bool:
    """A 400 that names the response format: the server (or its model) takes ``json`` only."""
    return reply.status_code == 400 and ("response_format" in reply.text or "verbose_json" in reply.text)

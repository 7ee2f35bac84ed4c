"""Stage builders of the ``speech`` family: ASR and TTS stages that call speech servers
(configs/services.yaml; ``duplex serve --asr URL --tts URL`` puts them into any bundled pipeline):

    asr  (wyoming.asr, stream)  caller audio -> transcripts, from a Wyoming ASR server
    asr  (openai.asr, stream)   caller audio -> transcripts, from POST /v1/audio/transcriptions
    tts  (wyoming.tts, stream)  reply text -> audio, phrase by phrase, from a Wyoming TTS server
    tts  (openai.tts, stream)   reply text -> audio, phrase by phrase, from POST /v1/audio/speech

Where the server is: ``args.url`` (``tcp://HOST:PORT`` for Wyoming, ``http(s)://HOST:PORT/v1`` for
OpenAI-compatible), else ``$DUPLEX_ASR_URL`` / ``$DUPLEX_TTS_URL``. All are ``stream`` stages: one
asyncio task and one connection per request (one HTTP request per phrase for ``openai.tts``), no
model in this process. ``builder_for`` picks the
builder from a URL's scheme (``duplex serve --asr/--tts``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from duplex.runtime.contract import BuildContext

if TYPE_CHECKING:
    from duplex.models.speech.asr import WyomingASR
    from duplex.models.speech.openai_asr import OpenAIASR
    from duplex.models.speech.openai_tts import OpenAITTS
    from duplex.models.speech.tts import WyomingTTS

# The wyoming client loads inside the builders: the registry imports this module in every
# process that reads it (the CLI, the coordinator), and only these stages need it.


_Args = TypeVar("_Args", bound=BaseModel)


class _ServerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    connect_timeout_s: float = Field(3.0, gt=0)
    stall_timeout_s: float = Field(10.0, gt=0)


class ASRArgs(_ServerArgs):
    transcript_timeout_s: float = Field(20.0, gt=0)
    settle_s: float = Field(0.1, gt=0)
    min_speech_s: float = Field(0.09, ge=0)
    language: str | None = "en"


class OpenAIASRArgs(ASRArgs):
    model: str = "whisper-1"  # the model name the server serves
    api_key_env: str = "DUPLEX_ASR_API_KEY"  # the variable holding the API key (never the config)


class TTSArgs(_ServerArgs):
    first_clause_words: int = Field(1, ge=1)
    clause_words: int = Field(4, ge=1)


class OpenAITTSArgs(TTSArgs):
    model: str = "tts-1"  # the model name the server serves
    voice: str = "alloy"  # when the session names none (the API requires one)
    response_format: Literal["pcm", "wav"] = "pcm"  # wav: for servers that give no raw pcm
    pcm_rate: int = Field(24000, ge=8000, le=48000)  # raw pcm's rate (OpenAI's: 24 kHz)
    api_key_env: str = "DUPLEX_TTS_API_KEY"  # the variable holding the API key (never the config)


def _parse(ctx: BuildContext, kind: type[_Args]) -> _Args:
    try:
        return kind.model_validate(ctx.args)
    except ValidationError as exc:
        problems = "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in exc.errors())
        raise ValueError(f"stage {ctx.stage}: {problems}") from None


def _url(ctx: BuildContext, url: str | None, variable: str, flag: str) -> str:
    found = url or os.environ.get(variable)
    if not found:
        raise ValueError(f"stage {ctx.stage}: no server: set args.url (duplex serve {flag} tcp://HOST:PORT) "
                         f"or ${variable}")
    return found


def build_asr(ctx: BuildContext) -> WyomingASR:
    from duplex.models.speech.asr import ASRSettings, WyomingASR
    from duplex.models.speech.client import parse_url

    args = _parse(ctx, ASRArgs)
    endpoint = parse_url(_url(ctx, args.url, "DUPLEX_ASR_URL", "--asr"), "asr server")
    return WyomingASR(endpoint, ASRSettings(
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        transcript_timeout_s=args.transcript_timeout_s, settle_s=args.settle_s, min_speech_s=args.min_speech_s,
        language=args.language))


def build_openai_asr(ctx: BuildContext) -> OpenAIASR:
    from duplex.models.speech.asr import ASRSettings
    from duplex.models.speech.openai_asr import OpenAIASR

    args = _parse(ctx, OpenAIASRArgs)
    url = _http_url(ctx, _url(ctx, args.url, "DUPLEX_ASR_URL", "--asr"))
    return OpenAIASR(url, args.model, os.environ.get(args.api_key_env) or "none", ASRSettings(
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        transcript_timeout_s=args.transcript_timeout_s, settle_s=args.settle_s, min_speech_s=args.min_speech_s,
        language=args.language))


def _http_url(ctx: BuildContext, url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"stage {ctx.stage}: {url!r}: expected the server's base URL, http(s)://HOST:PORT/v1")
    return url


def build_tts(ctx: BuildContext) -> WyomingTTS:
    from duplex.models.speech.client import parse_url
    from duplex.models.speech.tts import TTSSettings, WyomingTTS

    args = _parse(ctx, TTSArgs)
    endpoint = parse_url(_url(ctx, args.url, "DUPLEX_TTS_URL", "--tts"), "tts server")
    return WyomingTTS(endpoint, TTSSettings(
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        first_clause_words=args.first_clause_words, clause_words=args.clause_words))


def build_openai_tts(ctx: BuildContext) -> OpenAITTS:
    from duplex.models.speech.openai_tts import OpenAITTS, SpeechFormat
    from duplex.models.speech.phrasing import TTSSettings

    args = _parse(ctx, OpenAITTSArgs)
    url = _http_url(ctx, _url(ctx, args.url, "DUPLEX_TTS_URL", "--tts"))
    settings = TTSSettings(connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
                           first_clause_words=args.first_clause_words, clause_words=args.clause_words)
    speech = SpeechFormat(model=args.model, voice=args.voice, response_format=args.response_format,
                          pcm_rate=args.pcm_rate)
    return OpenAITTS(url, os.environ.get(args.api_key_env) or "none", settings, speech)


def builder_for(kind: str, url: str) -> str:
    """The builder of a ``kind`` (asr, tts) stage that calls the server at ``url``, by its scheme."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "tcp":
        return f"wyoming.{kind}"
    if scheme in ("http", "https"):
        return f"openai.{kind}"
    raise ValueError(f"--{kind} {url!r}: expected tcp://HOST:PORT (Wyoming) or http(s)://HOST:PORT/v1 "
                     f"(OpenAI-compatible)")


BUILDERS = {
    "wyoming.asr": build_asr,
    "openai.asr": build_openai_asr,
    "wyoming.tts": build_tts,
    "openai.tts": build_openai_tts,
}

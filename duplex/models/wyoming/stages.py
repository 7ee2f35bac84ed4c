"""Stage builders of the ``wyoming`` family: ASR and TTS stages that call speech servers speaking
the Wyoming protocol (configs/services.yaml; ``duplex serve --asr tcp://HOST:PORT --tts
tcp://HOST:PORT`` puts them into any bundled pipeline):

    asr  (wyoming.asr, stream)  caller audio -> transcripts, from a Wyoming ASR server
    tts  (wyoming.tts, stream)  reply text -> audio, phrase by phrase, from a Wyoming TTS server

Where the server is: ``args.url`` (``tcp://HOST:PORT``), else ``$DUPLEX_ASR_URL`` /
``$DUPLEX_TTS_URL``. Both are ``stream`` stages: one asyncio task and one connection per request,
no model in this process.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from duplex.runtime.contract import BuildContext

if TYPE_CHECKING:
    from duplex.models.wyoming.asr import WyomingASR
    from duplex.models.wyoming.tts import WyomingTTS

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


class TTSArgs(_ServerArgs):
    first_clause_words: int = Field(1, ge=1)
    clause_words: int = Field(4, ge=1)


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
    from duplex.models.wyoming.asr import ASRSettings, WyomingASR
    from duplex.models.wyoming.client import parse_url

    args = _parse(ctx, ASRArgs)
    endpoint = parse_url(_url(ctx, args.url, "DUPLEX_ASR_URL", "--asr"), "asr server")
    return WyomingASR(endpoint, ASRSettings(
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        transcript_timeout_s=args.transcript_timeout_s, settle_s=args.settle_s, min_speech_s=args.min_speech_s,
        language=args.language))


def build_tts(ctx: BuildContext) -> WyomingTTS:
    from duplex.models.wyoming.client import parse_url
    from duplex.models.wyoming.tts import TTSSettings, WyomingTTS

    args = _parse(ctx, TTSArgs)
    endpoint = parse_url(_url(ctx, args.url, "DUPLEX_TTS_URL", "--tts"), "tts server")
    return WyomingTTS(endpoint, TTSSettings(
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        first_clause_words=args.first_clause_words, clause_words=args.clause_words))


BUILDERS = {
    "wyoming.asr": build_asr,
    "wyoming.tts": build_tts,
}

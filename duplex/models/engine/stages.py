"""Stage builders of the ``engine`` family (configs/engine.yaml):

    asr      (local.asr, simple)  user audio -> transcripts
      | stream_to
    thinker  (engine.thinker, stream)  transcript -> reply text deltas and tool calls, streamed
             from an OpenAI-compatible engine (vLLM, SGLang, a hosted endpoint)
      | stream_to
    tts      (local.tts, simple)  text deltas -> audio, phrase by phrase

Where the engine is: ``args.base_url`` and ``args.model`` (``duplex serve --llm URL --llm-model
NAME`` sets both), else ``$DUPLEX_LLM_URL`` / ``$DUPLEX_LLM_MODEL``. The API key is read from the
environment variable ``args.api_key_env`` names (default ``DUPLEX_LLM_API_KEY``), never from the
config file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from duplex.models.engine.server_tools import ServerTool, ServerTools
from duplex.runtime.contract import BuildContext

if TYPE_CHECKING:
    from duplex.models.engine.thinker import EngineThinker

# The openai client loads inside build_thinker: the registry imports this module in every
# process that reads it (the CLI, the coordinator), and only the thinker stage needs it.
DEFAULT_SYSTEM = "You are a friendly voice assistant. Answer in one or two short spoken sentences."


class EngineThinkerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "DUPLEX_LLM_API_KEY"
    extra_body: dict[str, Any] = Field(default_factory=dict)  # engine-specific request fields (top_k, ...)
    system: str = DEFAULT_SYSTEM
    max_new_tokens: int = Field(64, ge=1)
    max_call_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)
    speech_chars_per_s: float = Field(15.0, gt=0)
    max_tool_rounds: int = Field(2, ge=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    stall_timeout_s: float = Field(10.0, gt=0)
    max_argument_bytes: int = Field(64 * 1024, ge=1)
    max_blank_run: int = Field(64, ge=1)  # whitespace in a row in a call's arguments: the model looped
    server_tools: list[ServerTool] = Field(default_factory=list)
    url_allowlist: list[str] = Field(default_factory=list)


def parse_args(ctx: BuildContext) -> EngineThinkerArgs:
    try:
        return EngineThinkerArgs.model_validate(ctx.args)
    except ValidationError as exc:
        problems = "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in exc.errors())
        raise ValueError(f"stage {ctx.stage}: {problems}") from None


def build_thinker(ctx: BuildContext) -> EngineThinker:
    from duplex.models.engine.client import EngineClient, EngineSettings
    from duplex.models.engine.thinker import EngineThinker, ThinkerSettings

    args = parse_args(ctx)
    base_url = args.base_url or os.environ.get("DUPLEX_LLM_URL")
    model = args.model or os.environ.get("DUPLEX_LLM_MODEL")
    if not base_url or not model:
        raise ValueError(f"stage {ctx.stage}: no engine: set args.base_url and args.model "
                         "(duplex serve --llm http://HOST:PORT/v1 --llm-model NAME), or $DUPLEX_LLM_URL and "
                         "$DUPLEX_LLM_MODEL")
    client = EngineClient(EngineSettings(
        base_url=base_url, model=model, api_key=os.environ.get(args.api_key_env) or "none",
        connect_timeout_s=args.connect_timeout_s, stall_timeout_s=args.stall_timeout_s,
        max_argument_bytes=args.max_argument_bytes, max_blank_run=args.max_blank_run, extra_body=args.extra_body))
    settings = ThinkerSettings(system=args.system, max_new_tokens=args.max_new_tokens,
                               max_call_tokens=args.max_call_tokens, stop=tuple(args.stop),
                               speech_chars_per_s=args.speech_chars_per_s, max_tool_rounds=args.max_tool_rounds)
    try:
        tools = ServerTools(tools=args.server_tools, url_allowlist=args.url_allowlist)
    except ValidationError as exc:
        raise ValueError(f"stage {ctx.stage}: " + "; ".join(e["msg"] for e in exc.errors())) from None
    return EngineThinker(client, settings, tools)


BUILDERS = {
    "engine.thinker": build_thinker,
}

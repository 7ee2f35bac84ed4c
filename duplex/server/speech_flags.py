"""``duplex serve --asr URL --tts URL``: the pipeline's ASR and TTS stages become stages that call
speech servers, in any bundled pipeline or config file (local ASR + engine thinker + a Wyoming
TTS, ...). The URL's scheme says the protocol: ``tcp://HOST:PORT`` is Wyoming;
``http(s)://HOST:PORT/v1`` is OpenAI-compatible (``/audio/transcriptions``, ``/audio/speech``).

The replaced stage keeps its name and its place (``stream_to``, ``terminal``); its builder,
scheduler and args become the ``speech`` family's. A stage that already calls a server of that
protocol (the ``services`` pipeline's) only gets the URL."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from duplex.config import ConfigError
from duplex.config.loader import pipeline_from_dict, resolve_config_path
from duplex.config.pipeline import PipelineConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--asr", metavar="URL", default=None,
                        help="the ASR is this speech server: tcp://HOST:PORT (Wyoming, e.g. wyoming-faster-whisper) or "
                             "http(s)://HOST:PORT/v1 (OpenAI-compatible); replaces the pipeline's asr stage")
    parser.add_argument("--tts", metavar="URL", default=None,
                        help="the TTS is this speech server: tcp://HOST:PORT (Wyoming, e.g. wyoming-piper) or "
                             "http(s)://HOST:PORT/v1 (OpenAI-compatible /audio/speech); replaces the pipeline's tts "
                             "stage")


def load_with_servers(config: str, overrides: list[str], asr: str | None, tts: str | None) -> PipelineConfig:
    """The pipeline config with its asr / tts stages calling the named servers."""
    from duplex.models.speech.client import parse_url  # checks a Wyoming URL (host, port)
    from duplex.models.speech.stages import builder_for

    path = resolve_config_path(config)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list):
        raise ConfigError(f"{path}: no stages list")
    for kind, url in (("asr", asr), ("tts", tts)):
        if url is not None:
            builder = builder_for(kind, url)
            if builder.startswith("wyoming."):
                parse_url(url, f"--{kind}")
            _replace(raw["stages"], kind, builder, url, str(path))
    return pipeline_from_dict(raw, overrides, source=str(path))


def _replace(stages: list[Any], kind: str, builder: str, url: str, source: str) -> None:
    found = [stage for stage in stages if isinstance(stage, dict)
             and (stage.get("name") == kind or str(stage.get("builder", "")).endswith(f".{kind}"))]
    if not found:
        raise ConfigError(f"{source}: --{kind}: the pipeline has no {kind} stage to replace")
    stage = found[0]
    if stage.get("builder") == builder:
        stage.setdefault("args", {})["url"] = url
        return
    kept = {key: stage[key] for key in ("name", "stream_to", "next", "wait_for", "terminal") if key in stage}
    stage.clear()
    stage.update(kept, builder=builder, scheduler={"kind": "stream", "max_running_requests": 64},
                 memory="100MiB", threads=1, args={"url": url})

"""``duplex serve``: read the command line and the pipeline config, then run the server
(``compose.serve``): the stage processes and the HTTP/WebRTC/phone edges and door plug-ins, stopped cleanly on
Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from duplex.config import ConfigError, load_pipeline
from duplex.config.session import SessionConfig
from duplex.edge import door_args
from duplex.edge.config import EdgeConfig
from duplex.edge.plugin import load_factory
from duplex.server import phone_edges, speech_flags
from duplex.server.recording_policy import DEFAULT_NOTICE, RecordingPolicy
from duplex.server.watch import WatchConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run the voice agent server (stage processes; WebRTC, WebSocket, phone "
                                          "and --door plug-in doors)")
    parser.add_argument("--config", default=None,
                        help="pipeline YAML, or a bundled config: local (default), engine (the default with --llm), "
                             "services (ASR, thinker and TTS all on servers), toy-voice, omni-tiny, toy")
    parser.add_argument("--llm", metavar="URL", default=None,
                        help="the thinker is this OpenAI-compatible engine (vLLM, SGLang, hosted), e.g. "
                             "http://127.0.0.1:8001/v1; sets the thinker stage's args.base_url (config: engine)")
    parser.add_argument("--llm-model", metavar="NAME", default=None,
                        help="the model name the engine serves (with --llm); API key: $DUPLEX_LLM_API_KEY")
    speech_flags.add_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--ice-server", action="append", default=[], metavar="URL",
                        help="STUN/TURN server for ICE (repeatable); none by default")
    parser.add_argument("--ice-loopback", action="store_true",
                        help="offer 127.0.0.1 ICE candidates only (tests, same-host clients)")
    parser.add_argument("--media-workers", type=int, default=EdgeConfig.model_fields["media_workers"].default,
                        metavar="N", help="run the WebRTC calls' media (ICE, DTLS, SRTP, Opus) in N worker processes "
                                          "instead of the server's event loop (0: in the server process; default "
                                          "%(default)s)")
    parser.add_argument("--media-stall-s", type=float, default=3.0,
                        help="a media worker that has not answered for this long is ended (its calls fail) and "
                             "started again")
    parser.add_argument("--aiortc-jitter-buffer", action="store_true",
                        help="keep aiortc's stock audio receive buffer (+60-80 ms; for comparison)")
    parser.add_argument("--instructions", default="", help="default instructions of every session")
    parser.add_argument("--log-level", default="warning",
                        help="info and below also prints one JSON line per call event (duplex.calls)")
    _add_watch_arguments(parser)
    _add_access_arguments(parser)
    door_args.add_arguments(parser)
    phone_edges.add_arguments(parser)
    parser.set_defaults(func=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config, overrides = engine_overrides(args.config, args.llm, args.llm_model, overrides)
        pipeline = speech_flags.load_with_servers(config, overrides, args.asr, args.tts) \
            if args.asr is not None or args.tts is not None else load_pipeline(config, overrides)
        edge = EdgeConfig(host=args.host, port=args.port, max_sessions=args.max_sessions,
                          ice_servers=args.ice_server, ice_loopback=args.ice_loopback,
                          media_workers=args.media_workers, media_stall_s=args.media_stall_s,
                          low_latency_receive=not args.aiortc_jitter_buffer, **access_settings(args),
                          **door_args.settings(args))
        plugins = [load_factory(spec) for spec in edge.doors]  # a bad --door stops here, before the stages start
        sessions_config = session_defaults(pipeline.session, args.instructions)
        phone = phone_edges.config_from_args(args)
        watch = watch_config(args)
    except (ConfigError, ValueError) as exc:  # pydantic's ValidationError, DoorError: ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from duplex.server.compose import serve  # the models and the runtime: only when serving

    doors = [*phone_edges.door_factories(phone), *plugins]  # the one list of doors beside WebRTC and WebSocket
    return asyncio.run(serve(pipeline, edge, sessions_config, args.log_level, doors, watch))


def watch_config(args: argparse.Namespace) -> WatchConfig:
    """The watch's settings; a bad recording policy is said in one line (ValueError)."""
    notice = {"record_notice": args.record_notice} if args.record_notice is not None else {}
    try:
        return WatchConfig(metrics=not args.no_metrics, call_log=args.call_log, record_dir=args.record,
                           record_policy=args.record_policy, record_share=args.record_share,
                           record_max_mb=args.record_max_mb, record_max_age_h=args.record_max_age_h,
                           drain_timeout_s=args.drain_timeout_s, **notice)
    except ValidationError as exc:  # pydantic's message names the model and links its docs: too much here
        raise ValueError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from None


def engine_overrides(config: str | None, llm: str | None, model: str | None,
                     overrides: list[str]) -> tuple[str, list[str]]:
    """``--llm URL --llm-model NAME`` as overrides of the thinker stage's args (the engine config
    unless another is named)."""
    if llm is None:
        if model is not None:
            raise ValueError("--llm-model needs --llm URL")
        return config or "local", overrides
    if not llm.startswith(("http://", "https://")):
        raise ValueError(f"--llm {llm!r}: expected the engine's base URL, e.g. http://127.0.0.1:8001/v1")
    if not model:
        raise ValueError("--llm needs --llm-model NAME (the model the engine serves; GET URL/models lists them)")
    return config or "engine", [*overrides, "--thinker.args.base_url", llm, "--thinker.args.model", model]


def session_defaults(settings: SessionConfig, instructions: str) -> SessionConfig:
    """The pipeline config's ``session`` block (checked at load) with the command line's instructions."""
    if not instructions:
        return settings
    try:
        return SessionConfig.model_validate({**settings.model_dump(), "instructions": instructions})
    except ValidationError as exc:
        raise ValueError(f"--instructions: {exc}") from None


def _add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    watch = parser.add_argument_group("watching the server (metrics, logs, recording, drain)")
    watch.add_argument("--no-metrics", action="store_true", help="no GET /metrics and no per-call instruments")
    watch.add_argument("--call-log", metavar="PATH", help="write the JSON call-event lines to this file")
    watch.add_argument("--record", metavar="DIR", type=Path,
                       help="keep call recordings here: a stereo WAV (caller left, agent right), its events as "
                            "JSON Lines and a sidecar naming its owner; alone, every call is recorded (off by "
                            "default)")
    watch.add_argument("--record-policy", choices=[p.value for p in RecordingPolicy], default=None,
                       help="which calls are recorded (with --record DIR): all (the default), share (a random "
                            "--record-share of calls), on_request (calls whose client asks: session recording: "
                            "true), none")
    watch.add_argument("--record-share", type=float, default=None, metavar="F",
                       help="record this fraction (0..1) of calls, drawn per call (implies --record-policy share)")
    watch.add_argument("--record-notice", default=None, metavar="TEXT",
                       help=f"what a recorded phone call (SIP, Twilio) says first (default: {DEFAULT_NOTICE!r})")
    watch.add_argument("--record-max-mb", type=float, default=1024.0, help="keep the recordings under this size")
    watch.add_argument("--record-max-age-h", type=float, default=24.0, help="delete recordings older than this")
    watch.add_argument("--drain-timeout-s", type=float, default=30.0,
                       help="on SIGTERM, live calls get this long to finish (new ones are refused)")


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access and the Realtime WebSocket (GET /v1/realtime)")
    group.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY"),
                       help="require Authorization: Bearer KEY on every endpoint but the demo page "
                            "(default: $DUPLEX_API_KEY; none: open to whoever reaches the port)")
    group.add_argument("--demo-open", action="store_true",
                       help="with --api-key: the demo page may get itself a short-lived client secret")
    group.add_argument("--secret-ttl-s", type=float, default=600.0, help="client secrets' default life")
    group.add_argument("--ws-max-frame-bytes", type=int, default=1 << 20, help="largest WebSocket message")
    group.add_argument("--ws-append-rate", type=float, default=4.0,
                       help="audio seconds a WebSocket client may append per second (after a 60 s burst)")
    group.add_argument("--ws-max-session-s", type=float, default=3600.0, help="longest WebSocket session")


def access_settings(args: argparse.Namespace) -> dict:
    """EdgeConfig's access and WebSocket limits from the command line (checked by EdgeConfig)."""
    if args.api_key and len(args.api_key) < 16:  # said here: pydantic's message would echo the key
        raise ValueError("--api-key (or DUPLEX_API_KEY) must be at least 16 characters")
    return {"access": {"api_key": args.api_key or None, "demo_open": args.demo_open,
                       "secret_ttl_s": args.secret_ttl_s},
            "realtime": {"max_frame_bytes": args.ws_max_frame_bytes, "append_rate": args.ws_append_rate,
                         "max_session_s": args.ws_max_session_s}}

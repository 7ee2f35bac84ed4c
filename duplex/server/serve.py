"""``duplex serve``: read the command line and the pipeline config, then run the server
(``compose.serve``): the stage processes and the HTTP/WebRTC/phone edges, stopped cleanly on
Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import ValidationError

from duplex.config import ConfigError, load_pipeline
from duplex.edge.config import EdgeConfig
from duplex.edge.telephony import phone_edges
from duplex.session.config import SessionConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run the voice agent server (WebRTC edge + stage processes)")
    parser.add_argument("--config", default="local",
                        help="pipeline YAML, or a bundled config: local (default), toy-voice, omni-tiny, toy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--ice-server", action="append", default=[], metavar="URL",
                        help="STUN/TURN server for ICE (repeatable); none by default")
    parser.add_argument("--ice-loopback", action="store_true",
                        help="offer 127.0.0.1 ICE candidates only (tests, same-host clients)")
    parser.add_argument("--aiortc-jitter-buffer", action="store_true",
                        help="keep aiortc's stock audio receive buffer (+60-80 ms; for comparison)")
    parser.add_argument("--instructions", default="", help="default instructions of every session")
    parser.add_argument("--log-level", default="warning")
    phone_edges.add_arguments(parser)
    parser.set_defaults(func=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        pipeline = load_pipeline(args.config, overrides)
        edge = EdgeConfig(host=args.host, port=args.port, max_sessions=args.max_sessions,
                          ice_servers=args.ice_server, ice_loopback=args.ice_loopback,
                          low_latency_receive=not args.aiortc_jitter_buffer)
        sessions_config = session_defaults(pipeline.session, args.instructions)
        phone = phone_edges.config_from_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from duplex.server.compose import serve  # the models and the runtime: only when serving

    return asyncio.run(serve(pipeline, edge, sessions_config, args.log_level, phone))


def session_defaults(settings: dict, instructions: str) -> SessionConfig:
    """The pipeline config's ``session`` block (checked here) with the command line's instructions."""
    try:
        return SessionConfig.model_validate({**settings, **({"instructions": instructions} if instructions else {})})
    except ValidationError as exc:
        raise ValueError(f"session settings of the pipeline config: {exc}") from None

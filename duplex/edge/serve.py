"""``duplex serve``: start the pipeline's stage processes and the HTTP/WebRTC edge; stop both
cleanly on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Iterator

import uvicorn
from pydantic import ValidationError

from duplex.config import ConfigError, load_pipeline
from duplex.edge.app import create_app
from duplex.edge.config import EdgeConfig
from duplex.edge.rtc_options import use_loopback_candidates
from duplex.edge.telephony import phone_edges
from duplex.edge.webrtc import WebRTCGateway
from duplex.session.config import SessionConfig
from duplex.session.manager import SessionManager

log = logging.getLogger("duplex.serve")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve`` owns shutdown order (edge first,
    then the stage processes), and uvicorn would re-raise the signal before that runs."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run the voice agent server (WebRTC edge + stage processes)")
    parser.add_argument("--config", default="local", help="pipeline YAML, or a name in configs/ (default: local)")
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
    return asyncio.run(serve(pipeline, edge, sessions_config, args.log_level, phone))


def session_defaults(settings: dict, instructions: str) -> SessionConfig:
    """The pipeline config's ``session`` block (checked here) with the command line's instructions."""
    try:
        return SessionConfig.model_validate({**settings, **({"instructions": instructions} if instructions else {})})
    except ValidationError as exc:
        raise ValueError(f"session settings of the pipeline config: {exc}") from None


async def serve(pipeline, edge: EdgeConfig, session_config: SessionConfig, log_level: str = "warning",
                phone: phone_edges.PhoneConfig | None = None) -> int:
    from duplex.models.registry import BUILDERS
    from duplex.runtime.coordinator import Coordinator
    from duplex.session.runtime_port import CoordinatorRuntime

    coordinator = Coordinator(pipeline, BUILDERS)
    print(f"duplex: starting {len(pipeline.stages)} stages of {pipeline.name} ...", flush=True)
    await coordinator.start()
    runtime = CoordinatorRuntime(coordinator)
    sessions = SessionManager(runtime, session_config, edge.max_sessions, model=pipeline.name)
    gateway = WebRTCGateway(sessions, edge)
    phones = phone_edges.PhoneEdges(phone or phone_edges.PhoneConfig(), sessions)
    use_loopback_candidates(edge.ice_loopback)
    app = create_app(runtime, sessions, gateway, other_edges=phones.stats_providers())
    server = _Server(uvicorn.Config(app, host=edge.host, port=edge.port, log_level=log_level,
                                    lifespan="off", ws="auto" if phones.needs_websockets else "none"))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    try:
        await phones.start(app)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            print(f"duplex: {pipeline.name} ready; demo page: http://{edge.host}:{port}/", flush=True)
        await task
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind
        print(f"error: the HTTP server could not start on {edge.host}:{edge.port}", file=sys.stderr)
        return int(exc.code or 1)
    except OSError as exc:  # the SIP socket could not bind
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await phones.close()
        await gateway.close_all()
        await coordinator.shutdown()
        print("duplex: stopped", flush=True)
    return 0

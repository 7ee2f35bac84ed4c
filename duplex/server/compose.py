"""Build the runtime, the sessions and the edges; serve until Ctrl-C or SIGTERM; stop the edges
first (no call is left half open), then the stage processes. SIGTERM drains first: new calls are
refused (503, Retry-After; ``/readyz`` says so) while live ones finish, up to a deadline; a second
signal, or Ctrl-C, stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
import sys
from collections.abc import Awaitable, Iterator

import uvicorn

from duplex.config import PipelineConfig
from duplex.config.session import SessionConfig
from duplex.edge.config import EdgeConfig
from duplex.edge.http.app import create_app
from duplex.edge.http.auth import Access
from duplex.edge.http.health import add_health_routes
from duplex.edge.http.protocol import accept_backlog, bound_server_logs, connection_cap, guarded_protocol
from duplex.edge.http.recordings import add_recording_routes
from duplex.edge.memory import MemoryKeeper
from duplex.edge.plugin import DoorContext, DoorError, DoorFactory, DoorPlugin, build_doors
from duplex.edge.webrtc.gateway import WebRTCGateway
from duplex.edge.webrtc.media_pool import MediaWorkers
from duplex.edge.webrtc.rtc_options import use_loopback_candidates, use_vectorised_audio_level
from duplex.lifecycle import StopSignals
from duplex.models.registry import BUILDERS
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.load import LoadMonitor
from duplex.server.admission import LoadAdmission
from duplex.server.runtime_adapter import CoordinatorRuntime
from duplex.server.turn_end import load_turn_end_model
from duplex.server.watch import ServerWatch, WatchConfig
from duplex.session.manager import SessionManager

log = logging.getLogger("duplex.server")
# uvicorn waits this long at a stop for open connections and their handlers, then cancels them
HTTP_STOP_GRACE_S = 5
STOP_REPORT_S = 20.0  # a stop not done by then prints every thread's stack


class _HttpServer(uvicorn.Server):
    """uvicorn without its own signal handling: the server's one ``StopSignals`` owns shutdown
    order (edge first, then the stage processes), and uvicorn would re-raise the signal before
    that runs."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(pipeline: PipelineConfig, edge: EdgeConfig, session_config: SessionConfig,
                log_level: str = "warning", doors: list[DoorFactory] | None = None,
                watch_config: WatchConfig | None = None) -> int:
    """``doors``: the plug-ins served beside WebRTC and the Realtime WebSocket (the phones' and
    ``--door``'s, ``edge/plugin``), in the order they start."""
    coordinator = Coordinator(pipeline, BUILDERS)
    print(f"duplex: starting {len(pipeline.stages)} stages of {pipeline.name} ...", flush=True)
    await coordinator.start()
    runtime = CoordinatorRuntime(coordinator)
    load = LoadMonitor(coordinator, pipeline.admission)  # admission by load reads its snapshot
    load.start()
    media = (MediaWorkers(edge, edge.media_workers, lag_window_s=pipeline.admission.lag_window_s)
             if edge.media_workers else None)  # started below
    admission = LoadAdmission(coordinator, load, pipeline.admission,
                              media_lag_s=media.loop_lag_s if media else None)  # a worker's loop counts too
    turn_end = load_turn_end_model(eager=session_config.semantic_turns)  # for semantic_vad sessions
    sessions = SessionManager(runtime, session_config, edge.max_sessions, model=pipeline.name, admission=admission,
                              turn_end=turn_end)
    try:
        plugins = build_doors(doors or [], DoorContext.of(sessions, edge))
    except DoorError as exc:  # before anything listens: stop what started and say why
        print(f"error: {exc}", file=sys.stderr)
        await load.stop()
        if turn_end is not None:
            turn_end.close()
        await coordinator.shutdown()
        return 2
    access = Access(edge.access)
    watch = ServerWatch(watch_config or WatchConfig(), coordinator, sessions, log_level,
                        auth_counters=lambda: access.counters)
    if watch.observes:
        sessions.observer = watch
    gateway = WebRTCGateway(sessions, edge, media.make_peer if media else None)
    use_loopback_candidates(edge.ice_loopback)
    use_vectorised_audio_level()
    memory = MemoryKeeper(ended=lambda: sessions.counters["closed"], live=sessions.live)  # ended calls' garbage
    others = {"memory": memory.stats_view, **({"media": media.stats} if media else {})}
    app = create_app(runtime, sessions, gateway, other_edges=others,
                     access=access, limits=edge.realtime, doors=plugins)
    add_health_routes(app, watch)  # /metrics behind the API key (AccessMiddleware); health probes open
    if watch.recorder is not None:  # /v1/recordings: the folder's, behind the key (recordings.py)
        add_recording_routes(app, watch.recorder.store, access)
    bound_server_logs(edge.http.error_log_per_minute)  # EMFILE on accept, invalid requests: rate-bounded
    server = _HttpServer(uvicorn.Config(app, host=edge.host, port=edge.port, log_level=log_level,
                                        lifespan="off", ws="auto", ws_max_size=_ws_max_size(edge),
                                        http=guarded_protocol(edge.http),  # header deadline, cap at accept
                                        limit_concurrency=connection_cap(edge.http.max_connections),
                                        backlog=accept_backlog(connection_cap(edge.http.max_connections)),
                                        timeout_keep_alive=max(1, round(edge.http.header_timeout_s)),
                                        timeout_graceful_shutdown=HTTP_STOP_GRACE_S,
                                        # the caller's address from X-Forwarded-For only via a trusted proxy
                                        proxy_headers=bool(edge.trusted_proxies),
                                        forwarded_allow_ips=edge.trusted_proxies or None))
    stop = StopSignals()  # before the ready line: a signal sent right after it must stop us cleanly
    stopper = asyncio.create_task(_exit_on_signal(stop, server, watch))
    try:
        for door in plugins:
            await door.start()
        if media is not None:
            print(f"duplex: starting {edge.media_workers} media workers ...", flush=True)
            await media.start()
        memory.start()
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
    except OSError as exc:  # a door's own socket (SIP's) could not bind
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stopper.cancel()
        stop.close()
        for door in reversed(plugins):
            await _stop_step(f"the {door.name} door", _close_door(door))
        await _stop_step("the WebRTC calls", gateway.close_all())
        if media is not None:
            await _stop_step("the media workers", media.stop(), 10.0 + 5.0 * edge.media_workers)
        await _stop_step("the load monitor", load.stop())
        await _stop_step("the memory keeper", memory.stop())
        if turn_end is not None:
            turn_end.close()
        await _stop_step("the stages", coordinator.shutdown(), 20.0)
        faulthandler.cancel_dump_traceback_later()
        print("duplex: stopped", flush=True)
    return 0


async def _stop_step(what: str, step: Awaitable[None], limit_s: float = 10.0) -> None:
    """One part of the stop, bounded: a part that hangs is named in the log and the stop goes
    on (the stage and media processes die with the server in any case)."""
    try:
        await asyncio.wait_for(step, limit_s)
    except TimeoutError:
        log.error("stopping: %s did not stop within %g s; going on without them", what, limit_s)


async def _close_door(door: DoorPlugin) -> None:
    """One door failing to close must not keep the others and the stages running."""
    try:
        await door.close()
    except Exception:
        log.exception("door %s failed to close", door.name)


def _ws_max_size(edge: EdgeConfig) -> int:
    """uvicorn's own cap on a WebSocket message, checked on each frame's header before the
    message is reassembled: twice the Realtime door's, so a message a little over the door's
    limit still gets the door's error event and close, and a huge one a bare 1009 close."""
    return 2 * edge.realtime.max_frame_bytes


async def _exit_on_signal(stop: StopSignals, server: uvicorn.Server, watch: ServerWatch) -> None:
    if await stop.wait() == signal.SIGTERM:
        again = StopSignals()  # a second signal while draining stops at once
        drained = asyncio.create_task(watch.drain())
        interrupted = asyncio.create_task(again.wait())
        await asyncio.wait({drained, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drained, interrupted):
            task.cancel()
        again.close()
    # a stop that hangs where no timeout reaches (a call into C, a blocked thread) must show
    # where: every thread's stack goes to stderr if the stop is not done by then
    faulthandler.dump_traceback_later(STOP_REPORT_S, exit=False)
    server.should_exit = True


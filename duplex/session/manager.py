"""All live sessions of a server: creation within a limit (none while draining), closing,
counters for stats, and the server's observer's tap on each (``observe.py``)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

from duplex.session import events as ev
from duplex.session.config import SessionConfig
from duplex.session.observe import CallObserver, CallTap, Refusal
from duplex.session.playout import OutputFormat
from duplex.session.port import VoiceRuntime
from duplex.session.session import VoiceSession


class SessionsFull(RuntimeError):
    reason = Refusal.FULL


class ServerDraining(SessionsFull):
    """The server is stopping: every door answers it as it answers a full server (busy, try
    again), so a load balancer retries the call elsewhere."""

    reason = Refusal.DRAINING


class SessionManager:
    def __init__(self, runtime: VoiceRuntime, config: SessionConfig, max_sessions: int, model: str,
                 observer: CallObserver | None = None) -> None:
        self.runtime = runtime
        self.config = config
        self.max_sessions = max_sessions
        self.model = model  # the pipeline's name, reported to clients as the session's model
        self.observer = observer  # None: nothing watched (no metrics, logs or recordings)
        self.sessions: dict[str, tuple[str, VoiceSession]] = {}  # id -> (transport, session)
        self.counters = {"opened": 0, "closed": 0, "rejected_full": 0, "rejected_draining": 0}
        self.draining = False  # set on SIGTERM: no new sessions, live ones go on
        self._empty = asyncio.Event()  # set whenever the last session closes

    def reserve(self, transport: str = "webrtc") -> None:
        """Raise SessionsFull (ServerDraining while draining) if no session may be opened now
        (call before costly setup)."""
        if self.draining:
            self.counters["rejected_draining"] += 1
            self.refused(transport, Refusal.DRAINING)
            raise ServerDraining("the server is shutting down; try again (another server)")
        if len(self.sessions) >= self.max_sessions:
            self.counters["rejected_full"] += 1
            self.refused(transport, Refusal.FULL)
            raise SessionsFull(f"all {self.max_sessions} sessions are in use; try again later")

    def refused(self, transport: str, reason: Refusal) -> None:
        """A door turned a call away (the doors report their own reasons too: bad offers)."""
        if self.observer is not None:
            self.observer.refused(transport, reason)

    def open(self, transport: str, send: Callable[[ev.ServerEvent], None], output_format: OutputFormat,
             config: SessionConfig | None = None, call_id: str | None = None) -> VoiceSession:
        self.reserve(transport)
        session_id = f"sess_{secrets.token_hex(8)}"
        made: list[VoiceSession] = []
        tap = None
        if self.observer is not None:
            tap = self.observer.open_call(session_id, transport, call_id or session_id, output_format)
            send = _tapped(send, tap, made)
        session = VoiceSession(session_id, self.runtime, config or self.config, send, output_format)
        made.append(session)
        if tap is not None:
            session.tap = tap
        self.sessions[session_id] = (transport, session)
        self.counters["opened"] += 1
        return session

    async def close(self, session: VoiceSession) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        await session.close()
        session.tap.close()
        self.counters["closed"] += 1
        if not self.sessions:
            self._empty.set()

    async def wait_empty(self, timeout: float) -> bool:
        """Wait until no session is live (up to ``timeout`` s); True if none is."""
        if self.sessions:
            self._empty.clear()
            try:
                await asyncio.wait_for(self._empty.wait(), timeout)
            except TimeoutError:
                pass
        return not self.sessions

    async def close_all(self) -> None:
        for _, session in list(self.sessions.values()):
            await self.close(session)

    def live(self, transport: str | None = None) -> int:
        return sum(1 for kind, _ in self.sessions.values() if transport is None or kind == transport)

    def stats(self) -> dict:
        return {"live": self.live(), "max": self.max_sessions, **self.counters,
                "sessions": {sid: {"transport": kind, **s.stats()} for sid, (kind, s) in self.sessions.items()}}


def _tapped(send: Callable[[ev.ServerEvent], None], tap: CallTap,
            made: list[VoiceSession]) -> Callable[[ev.ServerEvent], None]:
    """``send`` that also hands each event to the call's tap, with the request it concerns
    (``made``: the session, once it exists)."""

    def send_and_tap(event: ev.ServerEvent) -> None:
        send(event)
        response = made[0].response if made else None
        tap.event(event, response.turn.request_id if response is not None else None)

    return send_and_tap

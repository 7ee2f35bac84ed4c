"""All live sessions of a server: creation within a limit, closing, counters for stats."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from duplex.session import events as ev
from duplex.session.config import SessionConfig
from duplex.session.playout import OutputFormat
from duplex.session.port import VoiceRuntime
from duplex.session.session import VoiceSession


class SessionsFull(RuntimeError):
    pass


class SessionManager:
    def __init__(self, runtime: VoiceRuntime, config: SessionConfig, max_sessions: int, model: str) -> None:
        self.runtime = runtime
        self.config = config
        self.max_sessions = max_sessions
        self.model = model  # the pipeline's name, reported to clients as the session's model
        self.sessions: dict[str, tuple[str, VoiceSession]] = {}  # id -> (transport, session)
        self.counters = {"opened": 0, "closed": 0, "rejected_full": 0}

    def reserve(self) -> None:
        """Raise SessionsFull if no session may be opened now (call before costly setup)."""
        if len(self.sessions) >= self.max_sessions:
            self.counters["rejected_full"] += 1
            raise SessionsFull(f"all {self.max_sessions} sessions are in use; try again later")

    def open(self, transport: str, send: Callable[[ev.ServerEvent], None], output_format: OutputFormat,
             config: SessionConfig | None = None) -> VoiceSession:
        self.reserve()
        session_id = f"sess_{secrets.token_hex(8)}"
        session = VoiceSession(session_id, self.runtime, config or self.config, send, output_format)
        self.sessions[session_id] = (transport, session)
        self.counters["opened"] += 1
        return session

    async def close(self, session: VoiceSession) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        await session.close()
        self.counters["closed"] += 1

    async def close_all(self) -> None:
        for _, session in list(self.sessions.values()):
            await self.close(session)

    def live(self, transport: str | None = None) -> int:
        return sum(1 for kind, _ in self.sessions.values() if transport is None or kind == transport)

    def stats(self) -> dict:
        return {"live": self.live(), "max": self.max_sessions, **self.counters,
                "sessions": {sid: {"transport": kind, **s.stats()} for sid, (kind, s) in self.sessions.items()}}

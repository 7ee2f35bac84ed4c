"""All live sessions of a server: creation within a limit (none while draining, none while a
stage is down or the server is overloaded: the server's ``Admission``), closing, counters for
stats, and the server's observer's tap on each (``observe.py``)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from duplex.config.session import SessionConfig
from duplex.session.door import Door, SimpleDoor
from duplex.session.endpoint import TurnEndModel
from duplex.session.observe import CallObserver, CallTap, Refusal
from duplex.session.port import VoiceRuntime
from duplex.session.realtime import events as ev
from duplex.session.recording import Opening, SessionRecording
from duplex.session.session import VoiceSession


class SessionsFull(RuntimeError):
    """No session may be opened now; every door answers 503 with ``Retry-After``."""

    reason = Refusal.FULL
    retry_after_s: float = 5.0

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class ServerDraining(SessionsFull):
    """The server is stopping: every door answers it as it answers a full server (busy, try
    again), so a load balancer retries the call elsewhere."""

    reason = Refusal.DRAINING


class ServerOverloaded(SessionsFull):
    """Taking the call would push turn latency past the budget (admission by load)."""

    reason = Refusal.OVERLOADED


class StageDown(SessionsFull):
    """A stage of the pipeline is down: the call could not be served until it is back."""

    reason = Refusal.STAGE_DOWN


@dataclass(frozen=True)
class Refused:
    reason: Refusal  # OVERLOADED or STAGE_DOWN
    message: str
    retry_after_s: float


class Admission(Protocol):
    """The server's say on a new call beyond the session count; answers at once from state kept
    up to date in the background (it never waits on the stages)."""

    def refusal(self, live: int) -> Refused | None: ...  # live: the sessions open now


_REFUSED = {Refusal.OVERLOADED: ServerOverloaded, Refusal.STAGE_DOWN: StageDown}


class SessionManager:
    def __init__(self, runtime: VoiceRuntime, config: SessionConfig, max_sessions: int, model: str,
                 observer: CallObserver | None = None, admission: Admission | None = None,
                 turn_end: TurnEndModel | None = None) -> None:
        self.runtime = runtime
        self.config = config
        self.max_sessions = max_sessions
        self.model = model  # the pipeline's name, reported to clients as the session's model
        self.observer = observer  # None: nothing watched (no metrics, logs or recordings)
        self.sessions: dict[str, tuple[str, VoiceSession]] = {}  # id -> (transport, session)
        self.admission = admission  # None: only the session count limits new calls
        self.turn_end = turn_end  # semantic turns' end-of-turn model (None: they judge by words only)
        self.counters = {"opened": 0, "closed": 0, "rejected_full": 0, "rejected_draining": 0,
                         "rejected_overloaded": 0, "rejected_stage_down": 0}
        self.draining = False  # set on SIGTERM: no new sessions, live ones go on
        self._empty = asyncio.Event()  # set whenever the last session closes

    def reserve(self, transport: str = "webrtc") -> None:
        """Raise SessionsFull (ServerDraining while draining, StageDown or ServerOverloaded when
        the admission says so) if no session may be opened now (call before costly setup)."""
        if self.draining:
            self.counters["rejected_draining"] += 1
            self.refused(transport, Refusal.DRAINING)
            raise ServerDraining("the server is shutting down; try again (another server)")
        if len(self.sessions) >= self.max_sessions:
            self.counters["rejected_full"] += 1
            self.refused(transport, Refusal.FULL)
            raise SessionsFull(f"all {self.max_sessions} sessions are in use; try again later")
        refused = self.admission.refusal(len(self.sessions)) if self.admission is not None else None
        if refused is not None:
            self.counters[f"rejected_{refused.reason.value}"] += 1
            self.refused(transport, refused.reason)
            raise _REFUSED[refused.reason](refused.message, refused.retry_after_s)

    def refused(self, transport: str, reason: Refusal) -> None:
        """A door turned a call away (the doors report their own reasons too: bad offers)."""
        if self.observer is not None:
            self.observer.refused(transport, reason)

    def open(self, door: Door, config: SessionConfig | None = None, call_id: str | None = None,
             opening: Opening = Opening()) -> VoiceSession:
        """The one way every door opens a session (``door.py``: what the door gives it);
        ``opening``: who opens it and whether they ask to be recorded (``recording.py``)."""
        transport = door.transport
        self.reserve(transport)
        session_id = f"sess_{secrets.token_hex(8)}"
        made: list[VoiceSession] = []
        watch = None
        if self.observer is not None:
            watch = self.observer.open_call(session_id, transport, call_id or session_id, door.output, opening)
            door = SimpleDoor(transport, door.output, _tapped(door.deliver, watch.tap, made), door.clear_audio,
                              door.control)
        session = VoiceSession(session_id, self.runtime, config or self.config, door, turn_end=self.turn_end)
        made.append(session)
        if watch is not None:
            session.tap, session.recording = watch.tap, SessionRecording(watch.recording)
        session.recording.open(opening.record)
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

"""What the server needs of a door to serve it, and what it gives the door's factory.

A plug-in is made by a factory from a ``DoorContext`` (the sessions and what a door needs of the
server's settings). The server mounts its ``router()`` on its app, behind the same Host/Origin
guard and API-key middleware as the built-in routes; ``start()``s it once the app exists and
``close()``s it at shutdown, before the stage processes stop; ``stats()`` is shown under
``edges[name]`` in ``GET /duplex/stats`` (redacted by shape there, as every door's stats are).

What the door does with a call is the session seam (``session/door.py``): ``SessionManager.open``
with a ``Door``, ``push_input``, ``pull_output`` paced by ``session/pacing.py``, ``close``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import APIRouter

from duplex.edge.config import EdgeConfig
from duplex.edge.rate import DoorAdmission, RateConfig
from duplex.session.manager import SessionManager

# The names /duplex/stats already uses under ``edges`` for the server's own parts: a plug-in named
# like one would hide it.
RESERVED_NAMES = frozenset({"webrtc", "websocket", "http", "access", "memory", "media"})


@dataclass(frozen=True)
class DoorContext:
    """What a door factory is given: the sessions every door opens calls on, and the server's
    settings that hold for every door."""

    sessions: SessionManager
    max_call_s: float  # a call lasts at most this long, on any door
    call_rate: RateConfig  # new calls per source / in all, per door (``edge/rate.py``'s CallRate)
    limit_loopback: bool  # rate-limit the host's own clients too

    @classmethod
    def of(cls, sessions: SessionManager, edge: EdgeConfig) -> DoorContext:
        return cls(sessions, edge.max_call_s, edge.call_rate, edge.limit_loopback)

    def admission(self, door: str, connect_deadline_s: float) -> DoorAdmission:
        """The server's rules for this door's new calls, as every built-in door has them: ask
        ``admit(address)`` before any work for a call, release what it returns once the call is
        connected (its first audio) or over."""
        return DoorAdmission(self.call_rate, door, self.sessions.max_sessions, connect_deadline_s,
                             self.limit_loopback)


class DoorPlugin(Protocol):
    @property
    def name(self) -> str:
        """Its key under ``edges`` in /duplex/stats (unique on the server)."""

    def router(self) -> APIRouter | None:
        """Its HTTP and WebSocket routes, or None (a door on its own socket, as SIP)."""

    async def start(self) -> None:
        """Open what the door listens on beyond the app's routes (a UDP socket ...)."""

    async def close(self) -> None:
        """End its calls and release what it holds; the server then stops the stages."""

    def stats(self) -> dict:
        """Counters for /duplex/stats (plain JSON values)."""


DoorFactory = Callable[[DoorContext], DoorPlugin]

"""The Twilio Media Streams door as a plug-in (``edge/plugin``): its WebSocket and TwiML
routes on the server's app, its calls on the server's sessions through the phone seam."""

from __future__ import annotations

from fastapi import APIRouter

from duplex.edge.phone.session_agent import session_agents
from duplex.edge.plugin import DoorContext, DoorFactory
from duplex.edge.twilio.config import TwilioLimits
from duplex.edge.twilio.stream import TwilioEndpoint


class TwilioDoor:
    name = "twilio"

    def __init__(self, limits: TwilioLimits, context: DoorContext) -> None:
        self.endpoint = TwilioEndpoint(session_agents(context.sessions), limits, context.sessions.max_sessions)

    def router(self) -> APIRouter | None:
        return self.endpoint.router()

    async def start(self) -> None:
        """Nothing beyond its routes to open."""

    async def close(self) -> None:
        """Its streams end with their sockets; it holds nothing else."""

    def stats(self) -> dict:
        return self.endpoint.stats()


def twilio_door(limits: TwilioLimits) -> DoorFactory:
    return lambda context: TwilioDoor(limits, context)

"""The SIP door as a plug-in (``edge/plugin``): a UDP socket of its own beside the app, its calls
on the server's sessions through the phone seam; its routes place calls (``outbound_api``)."""

from __future__ import annotations

from fastapi import APIRouter

from duplex.edge.phone.session_agent import session_agents, session_reserve
from duplex.edge.plugin import DoorContext, DoorFactory
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.outbound_api import outbound_router
from duplex.edge.sip.uas import SipServer


class SipDoor:
    name = "sip"

    def __init__(self, config: SipConfig, context: DoorContext) -> None:
        self.server = SipServer(config, session_agents(context.sessions), session_reserve(context.sessions))
        self._sessions = context.sessions

    def router(self) -> APIRouter | None:
        return outbound_router(self.server.outbound, self._sessions)  # placed calls (off unless allowed)

    async def start(self) -> None:
        await self.server.start()  # OSError when the port is taken: the server reports it and exits
        host, port = self.server.address
        print(f"duplex: SIP on udp {host}:{port}", flush=True)  # port 0 picked one: tests read it here

    async def close(self) -> None:
        await self.server.stop()

    def stats(self) -> dict:
        return self.server.stats()


def sip_door(config: SipConfig) -> DoorFactory:
    return lambda context: SipDoor(config, context)

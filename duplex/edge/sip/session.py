"""The session side of a SIP call: whether there is room for one more (max_calls, a free
session), and, once its 200 OK is ACKed, opening its session (the agent), starting its media
and arming its maximum duration; trust for its addresses while it lasts (``guard``)."""

from __future__ import annotations

import asyncio
import logging

from duplex.edge.phone.bridge import AgentUnavailable, CallInfo
from duplex.edge.sip.context import CallTable
from duplex.edge.sip.control import SipCallControl
from duplex.edge.sip.dialog import CallState, SipCall
from duplex.edge.sip.pending import in_dialog_destination

log = logging.getLogger(__name__)


class CallSessions:
    def __init__(self, calls: CallTable) -> None:
        self._calls = calls
        self.open_agents = 0

    def room_for_one_more(self) -> bool:
        """Below max_calls (counting calls that hold a session) and a session free now."""
        held = sum(call.state is CallState.CONFIRMED for call in self._calls.active.values())
        if held >= self._calls.server.config.max_calls:
            return False
        if self._calls.reserve is not None:
            try:
                self._calls.reserve("sip")
            except AgentUnavailable as exc:
                log.warning("INVITE refused: %s", exc)
                return False
        return True

    def confirm(self, call: SipCall) -> None:
        """The 200 OK was ACKed: the call is real. Now it takes a session and its media starts."""
        call.state = CallState.CONFIRMED
        self._calls.server.guard.trust(hosts(call))
        loop = asyncio.get_running_loop()
        call.limit_timer = loop.call_later(self._calls.server.config.max_call_s, self._too_long,
                                           call.call_id)
        call.answer_task = loop.create_task(self._attach_agent(call))

    async def _attach_agent(self, call: SipCall) -> None:
        try:
            caller, callee = (call.local, call.remote) if call.opening is not None else (call.remote, call.local)
            call.agent = await self._calls.agent_factory(CallInfo(
                call.call_id, "sip", caller.uri, callee.uri, opening=call.opening,
                control=SipCallControl(self._calls, call)))
        except AgentUnavailable as exc:  # taken by another door since the INVITE
            self._calls.server.counters["busy"] += 1
            log.warning("call %s: no session after its ACK: %s", call.call_id, exc)
            self._calls.hang_up(call.call_id, "no session available")
            return
        except Exception:  # a bug in opening the session costs this call, never the server
            log.exception("call %s: opening its session failed", call.call_id)
            self._calls.server.counters["answer_failures"] += 1
            self._calls.hang_up(call.call_id, "answer failed")
            return
        self.open_agents += 1
        if call.state is not CallState.CONFIRMED:  # ended while the agent was being made
            agent, call.agent = call.agent, None
            await agent.close()
            self.open_agents -= 1
            return
        if call.agreed is not None and call.media is not None and not call.media.running:
            call.media.start(call.agent, call.agreed)

    def _too_long(self, call_id: str) -> None:
        self._calls.server.guard.refusals.note("max_duration", "call reached max_call_s; hung up")
        self._calls.hang_up(call_id, "maximum call duration")

    def timed_out(self, call_id: str) -> None:
        self._calls.server.guard.refusals.note("rtp_timeouts", "no RTP for rtp_timeout_s; hung up")
        self._calls.hang_up(call_id, "no RTP")

    def failed(self, call_id: str, exc: Exception) -> None:
        self._calls.hang_up(call_id, f"server error: {type(exc).__name__}")

    def release(self, call: SipCall) -> None:
        """The call ended: its duration timer and the trust in its addresses go."""
        if call.limit_timer is not None:  # it was confirmed, so its hosts were trusted
            call.limit_timer.cancel()
            call.limit_timer = None
            self._calls.server.guard.untrust(hosts(call))


def hosts(call: SipCall) -> set[str]:
    """Where a confirmed call's signalling goes: its source and its in-dialog target."""
    return {call.peer[0], in_dialog_destination(call)[0]}

"""What call handling (``sip_calls``) sees of the SIP server: a validated request, and the few
server functions it calls. A protocol, so the server can own call handling without the two
modules importing each other."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from duplex.edge.phone.bridge import AgentFactory, Reserve
from duplex.edge.sip.access import AccessPolicy
from duplex.edge.sip.client_transactions import ClientTransaction, ClientTransactions, ResponseHandler
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.dialog import SipCall
from duplex.edge.sip.guard import SipGuard
from duplex.edge.sip.headers import NameAddr, Via
from duplex.edge.sip.message import SipRequest
from duplex.edge.sip.transactions import Address, ServerTransaction, TransactionKey, TransactionTable


@dataclass
class RequestContext:
    """A request that passed validation, with its parsed identifying headers."""

    request: SipRequest
    addr: Address
    via: Via
    from_: NameAddr
    to: NameAddr
    call_id: str
    cseq: int
    key: TransactionKey

    @property
    def method(self) -> str:
        return self.request.method


class SignallingServer(Protocol):
    config: SipConfig
    policy: AccessPolicy
    counters: collections.Counter[str]
    transactions: TransactionTable
    client: ClientTransactions
    guard: SipGuard

    @property
    def contact_address(self) -> Address: ...

    def respond(self, request: SipRequest, transaction: ServerTransaction, status: int, *,
                to_tag: str = "", headers: list[tuple[str, str]] | None = None,
                body: bytes = b"", reason: str = "", send: bool = True) -> bytes: ...

    def send_request(self, request: SipRequest, addr: Address, on_response: ResponseHandler | None = None,
                     on_timeout: Callable[[], None] | None = None) -> ClientTransaction: ...

    def send_raw(self, payload: bytes, addr: Address) -> None: ...

    def respond_stateless(self, request: SipRequest, addr: Address, status: int,
                          reason: str = "", headers: list[tuple[str, str]] | None = None) -> None: ...


class CallTable(Protocol):
    """What the helpers of call handling (``pending``, ``session``) see of it."""

    server: SignallingServer
    active: dict[str, SipCall]
    agent_factory: AgentFactory
    reserve: Reserve | None

    def hang_up(self, call_id: str, reason: str) -> None: ...

    def schedule_end(self, call: SipCall, reason: str) -> None: ...

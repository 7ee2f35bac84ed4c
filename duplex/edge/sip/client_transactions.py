"""Our requests as SIP client transactions over UDP (RFC 3261 §17.1, with RFC 6026's Accepted).

One mechanism for INVITE and the rest (BYE, CANCEL, REFER, NOTIFY answers are server side):

- INVITE: sent again after T1, 2*T1, 4*T1 ... (timer A) until a response; no response within
  64*T1 (timer B) is a timeout. A provisional response stops the retransmissions (the caller
  of ``start`` ends a ringing INVITE with CANCEL; ``PROCEEDING_LIMIT_S`` bounds it anyway). A
  non-2xx final response is ACKed here, with the INVITE's branch, and its retransmissions are
  ACKed again for 64*T1 (timer D). A 2xx is the dialog's to ACK: the transaction stays Accepted
  for 64*T1 and hands every retransmitted 2xx to the caller, who ACKs it again.
- Other methods: sent again after T1, 2*T1 ... capped at T2 (timer E) until a final response;
  none within 64*T1 (timer F) is a timeout. After the final response, retransmissions of it are
  absorbed for T4.

A transaction is keyed by its branch and method (a CANCEL shares its INVITE's branch).
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex.edge.sip.headers import parse_cseq, parse_via
from duplex.edge.sip.message import SipParseError, SipRequest, SipResponse
from duplex.edge.sip.transactions import Address, Retransmitter

T4_S = 5.0
PROCEEDING_LIMIT_S = 180.0  # an INVITE that rings for ever still ends (RFC 3261's timer C)
ResponseHandler = Callable[[SipResponse], None]


class ClientState(enum.Enum):
    CALLING = "calling"  # sent, nothing heard yet (Trying for non-INVITE)
    PROCEEDING = "proceeding"  # a provisional response came
    ACCEPTED = "accepted"  # INVITE: a 2xx came; later 2xx retransmissions go to the caller
    COMPLETED = "completed"  # a final response came; its retransmissions are absorbed
    TERMINATED = "terminated"


def _nothing(response: SipResponse) -> None:
    return None


@dataclass(eq=False)
class ClientTransaction:
    request: SipRequest
    addr: Address
    on_response: ResponseHandler  # every provisional, the final, and (INVITE) each 2xx retransmitted
    on_timeout: Callable[[], None]
    state: ClientState = ClientState.CALLING
    final: SipResponse | None = None
    ack: bytes = b""  # the ACK of a non-2xx final response (INVITE), sent again on its retransmissions
    retransmitter: Retransmitter | None = None
    timer: asyncio.TimerHandle | None = None
    key: tuple[str, str] = field(default=("", ""))

    @property
    def is_invite(self) -> bool:
        return self.request.method == "INVITE"


class ClientTransactions:
    def __init__(self, send: Callable[[bytes, Address], None], t1: float) -> None:
        self._send = send
        self.t1 = t1
        self.active: dict[tuple[str, str], ClientTransaction] = {}

    def __len__(self) -> int:
        return len(self.active)

    def start(self, request: SipRequest, addr: Address, on_response: ResponseHandler | None = None,
              on_timeout: Callable[[], None] | None = None) -> ClientTransaction:
        """Send ``request`` (its top Via carries a fresh branch) and follow it to its end."""
        branch = parse_via(request.get("Via") or "").branch
        transaction = ClientTransaction(request, addr, on_response or _nothing, on_timeout or (lambda: None),
                                        key=(branch, request.method))
        self.active[transaction.key] = transaction
        payload = request.serialize()
        cap = math.inf if transaction.is_invite else None  # timer A doubles without T2's cap
        transaction.retransmitter = Retransmitter(lambda: self._send(payload, addr), self.t1,
                                                  on_give_up=lambda: self._timed_out(transaction), cap=cap)
        return transaction

    def received(self, response: SipResponse) -> bool:
        """A response to one of our requests (False: it matches none, a stray)."""
        try:
            branch = parse_via(response.get("Via") or "").branch
            _, method = parse_cseq(response.get("CSeq") or "")
        except SipParseError:
            return False
        transaction = self.active.get((branch, method))
        if transaction is None:
            return False
        if transaction.state is ClientState.COMPLETED:  # a retransmitted final answer
            if transaction.ack:
                self._send(transaction.ack, transaction.addr)
            return True
        if transaction.state is ClientState.ACCEPTED:
            if 200 <= response.status < 300:
                transaction.on_response(response)  # the dialog ACKs each 2xx (RFC 6026)
            return True
        if response.status < 200:
            self._provisional(transaction, response)
        else:
            self._final(transaction, response)
        return True

    def cancel_retransmissions(self, transaction: ClientTransaction) -> None:
        """Stop sending the request again (a CANCEL follows instead); the transaction waits on."""
        if transaction.retransmitter is not None:
            transaction.retransmitter.stop()

    def close(self) -> None:
        for transaction in list(self.active.values()):
            self._terminate(transaction)

    # -- states -------------------------------------------------------------------------------

    def _provisional(self, transaction: ClientTransaction, response: SipResponse) -> None:
        if transaction.state is ClientState.CALLING:
            transaction.state = ClientState.PROCEEDING
            if transaction.is_invite:  # §17.1.1.2: no more retransmissions once something answers
                self.cancel_retransmissions(transaction)
                self._later(transaction, PROCEEDING_LIMIT_S, lambda: self._timed_out(transaction))
        transaction.on_response(response)

    def _final(self, transaction: ClientTransaction, response: SipResponse) -> None:
        self.cancel_retransmissions(transaction)
        transaction.final = response
        if transaction.is_invite and response.status < 300:
            transaction.state = ClientState.ACCEPTED
            self._later(transaction, 64 * self.t1, lambda: self._terminate(transaction))
        else:
            transaction.state = ClientState.COMPLETED
            if transaction.is_invite:
                transaction.ack = non_2xx_ack(transaction.request, response).serialize()
                self._send(transaction.ack, transaction.addr)
            linger = 64 * self.t1 if transaction.is_invite else T4_S
            self._later(transaction, linger, lambda: self._terminate(transaction))
        transaction.on_response(response)

    def _timed_out(self, transaction: ClientTransaction) -> None:
        if transaction.state in (ClientState.CALLING, ClientState.PROCEEDING):
            self._terminate(transaction)
            transaction.on_timeout()

    def _later(self, transaction: ClientTransaction, delay: float, then: Callable[[], None]) -> None:
        if transaction.timer is not None:
            transaction.timer.cancel()
        transaction.timer = asyncio.get_running_loop().call_later(delay, then)

    def _terminate(self, transaction: ClientTransaction) -> None:
        transaction.state = ClientState.TERMINATED
        self.cancel_retransmissions(transaction)
        if transaction.timer is not None:
            transaction.timer.cancel()
            transaction.timer = None
        if self.active.get(transaction.key) is transaction:
            del self.active[transaction.key]


def non_2xx_ack(invite: SipRequest, response: SipResponse) -> SipRequest:
    """RFC 3261 §17.1.1.3: the INVITE's URI, top Via, From, Call-ID and Routes, the answer's To."""
    ack = SipRequest(method="ACK", uri=invite.uri)
    ack.add("Via", invite.get("Via") or "")
    ack.add("Max-Forwards", "70")
    for route in invite.get_all("Route"):
        ack.add("Route", route)
    ack.add("From", invite.get("From") or "")
    ack.add("To", response.get("To") or invite.get("To") or "")
    ack.add("Call-ID", invite.get("Call-ID") or "")
    number = (invite.get("CSeq") or "1").split(" ")[0]
    ack.add("CSeq", f"{number} ACK")
    return ack

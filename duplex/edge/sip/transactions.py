"""SIP transaction timing over UDP (RFC 3261 §17): retransmission and response caching.

Server side: a request's final response is kept for 64*T1 and re-sent when the request is
retransmitted; an INVITE's final response is itself retransmitted (T1, 2*T1 ... capped at T2)
until its ACK arrives. The client side (our requests) is ``client_transactions``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex.edge.sip.headers import BRANCH_COOKIE, Via
from duplex.edge.sip.message import SipRequest

T2_S = 4.0
Address = tuple[str, int]
TransactionKey = tuple[str, ...]


def server_key(request: SipRequest, via: Via) -> TransactionKey:
    """RFC 3261 §17.2.3: branch + sent-by + method, with ACK matching its INVITE."""
    method = "INVITE" if request.method == "ACK" else request.method
    sent_by = f"{via.host}:{via.port or 5060}"
    if via.branch.startswith(BRANCH_COOKIE):
        return (via.branch, sent_by, method)
    # RFC 2543 peers: no unique branch; fall back on the dialog identifiers and CSeq number
    cseq = (request.get("CSeq") or "").split(" ")[0]
    return (request.get("Call-ID") or "", request.get("From") or "", cseq, sent_by, method)


class Retransmitter:
    """Calls ``send`` now, then after T1, 2*T1, 4*T1 ... (capped at T2, or ``cap``) until
    ``stop``; after 64*T1 (or ``limit_s``, if given) calls ``on_give_up`` instead."""

    def __init__(self, send: Callable[[], None], t1: float,
                 on_give_up: Callable[[], None] | None = None,
                 limit_s: float | None = None, cap: float | None = None) -> None:
        self._send = send
        self._cap = T2_S if cap is None else cap
        self._t1 = t1
        self._limit_s = 64 * t1 if limit_s is None else limit_s
        self._on_give_up = on_give_up
        self._loop = asyncio.get_running_loop()
        self._elapsed = 0.0
        self._interval = t1
        self._handle: asyncio.TimerHandle | None = None
        send()
        self._schedule()

    def _schedule(self) -> None:
        delay = min(self._interval, max(0.0, self._limit_s - self._elapsed))
        self._handle = self._loop.call_later(delay, self._fire, delay)

    def _fire(self, delay: float) -> None:
        self._elapsed += delay
        if self._elapsed >= self._limit_s - 1e-9:
            self._handle = None
            if self._on_give_up is not None:
                self._on_give_up()
            return
        self._send()
        self._interval = min(self._interval * 2, self._cap)
        self._schedule()

    @property
    def active(self) -> bool:
        return self._handle is not None

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass
class ServerTransaction:
    key: TransactionKey
    addr: Address
    response: bytes | None = None
    status: int = 0
    retransmitter: Retransmitter | None = None
    expiry: asyncio.TimerHandle | None = None
    on_cancel: Callable[[], None] | None = None  # set while an INVITE waits for its answer


@dataclass
class TransactionTable:
    send: Callable[[bytes, Address], None]
    t1: float
    server: dict[TransactionKey, ServerTransaction] = field(default_factory=dict)

    def open(self, key: TransactionKey, addr: Address) -> ServerTransaction:
        transaction = ServerTransaction(key, addr)
        self.server[key] = transaction
        # a transaction that never gets a final response (a bug, a stuck answer) still expires
        self._expire_later(transaction, 64 * self.t1 * 4)
        return transaction

    def respond(self, transaction: ServerTransaction, response: bytes, status: int,
                is_invite: bool, send: bool = True) -> None:
        """Record (and unless ``send`` is False, send) the transaction's latest response."""
        transaction.response, transaction.status = response, status
        if status < 200:
            if send:
                self.send(response, transaction.addr)
            return
        transaction.on_cancel = None
        if is_invite and status >= 300:
            # retransmitted until the ACK (timer G), given up after 64*T1 (timer H)
            transaction.retransmitter = Retransmitter(
                lambda: self.send(response, transaction.addr), self.t1,
                on_give_up=lambda: self.forget(transaction.key))
        elif send:
            self.send(response, transaction.addr)
        # 2xx to INVITE: the dialog retransmits it; the transaction only absorbs duplicates
        self._expire_later(transaction, 64 * self.t1)

    def acknowledge(self, key: TransactionKey) -> bool:
        transaction = self.server.get(key)
        if transaction is None or transaction.retransmitter is None:
            return False
        transaction.retransmitter.stop()
        return True

    def forget(self, key: TransactionKey) -> None:
        transaction = self.server.pop(key, None)
        if transaction is None:
            return
        if transaction.retransmitter is not None:
            transaction.retransmitter.stop()
        if transaction.expiry is not None:
            transaction.expiry.cancel()

    def close(self) -> None:
        for key in list(self.server):
            self.forget(key)

    def _expire_later(self, transaction: ServerTransaction, delay: float) -> None:
        if transaction.expiry is not None:
            transaction.expiry.cancel()
        loop = asyncio.get_running_loop()
        transaction.expiry = loop.call_later(delay, self.forget, transaction.key)

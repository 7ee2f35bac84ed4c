"""The data plane between processes on one host: shared-memory blocks with credits and acks.

Producer (``RelayWriter``): packs a value; small ones ride inline in the control message, larger
ones are written into a pooled shm block and only a reference travels. A block stays owned by
the producer until the consumer acks it; each consumer has ``credits_per_peer`` blocks in flight
at most. A block whose ack never comes (consumer gone) is reclaimed after ``ack_timeout_s``.

Consumer (``RelayReader``): rebuilds the value. Blocks under ``zero_copy_min_bytes`` are copied
out and acked at once; bigger ones are handed out as views and acked when the last view dies,
so a 16 MiB tensor crosses with one copy. A scheduler that keeps a big input across steps
should clone it, or it pins the producer's block.

Inside one process no relay is used: stages pass object references (see ``stage_host``).
A CUDA IPC transport would be a third kind of ``Payload`` reference beside inline and shm.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duplex.config.pipeline import RelayConfig
from duplex.runtime import shm
from duplex.runtime.codec import Packed, pack, unpack
from duplex.runtime.messages import DataReady, Payload, ShmRef

MIN_BLOCK = 64 * 1024


@dataclass(eq=False)
class _Block:
    segment: shm.Segment
    size: int
    array: np.ndarray | None = field(default=None, repr=False)  # uint8 view, made once per block

    def view(self) -> np.ndarray:
        if self.array is None:
            self.array = np.frombuffer(self.segment.buf, dtype=np.uint8)
        return self.array


class ShmPool:
    """Blocks in power-of-two size classes, one segment each, reused through free lists."""

    def __init__(self, name_prefix: str, capacity_bytes: int) -> None:
        self._prefix = name_prefix
        self._capacity = capacity_bytes
        self._free: dict[int, list[_Block]] = {}
        self._allocated = 0
        self._names = itertools.count(1)

    @staticmethod
    def size_class(nbytes: int) -> int:
        return max(MIN_BLOCK, 1 << (max(nbytes, 1) - 1).bit_length())

    def acquire(self, nbytes: int) -> _Block | None:
        size = self.size_class(nbytes)
        free = self._free.get(size)
        if free:
            block = free.pop()
        else:
            if size > self._capacity:
                raise ValueError(f"payload of {nbytes} bytes exceeds the relay pool ({self._capacity} bytes)")
            if self._allocated + size > self._capacity and not self._evict_free(size):
                return None
            block = _Block(shm.Segment.create(f"{self._prefix}{next(self._names)}", size), size)
            self._allocated += size
        return block

    def release(self, block: _Block) -> None:
        self._free.setdefault(block.size, []).append(block)

    def _evict_free(self, needed: int) -> bool:
        for size in sorted(self._free, reverse=True):
            while self._free[size] and self._allocated + needed > self._capacity:
                self._destroy(self._free[size].pop())
        return self._allocated + needed <= self._capacity

    def _destroy(self, block: _Block) -> None:
        block.array = None  # else the mapping cannot close
        block.segment.close()
        block.segment.unlink()
        self._allocated -= block.size

    def close(self, in_use: list[_Block]) -> None:
        for block in [*in_use, *(b for blocks in self._free.values() for b in blocks)]:
            self._destroy(block)
        self._free.clear()


class RelayWriter:
    def __init__(self, owner_prefix: str, cfg: RelayConfig, use_shm: bool = True) -> None:
        self._cfg = cfg
        self._use_shm = use_shm
        self._pool = ShmPool(owner_prefix, cfg.pool_bytes) if use_shm else None
        # ticket -> (block, consumer, deadline); a ticket names one use of a block, so a late
        # ack for an earlier use can never free the block's current use
        self._in_flight: dict[int, tuple[_Block, str, float]] = {}
        self._tickets = itertools.count(1)
        self._per_peer: dict[str, int] = {}

    def pack(self, value: Any) -> Packed:
        return pack(value)

    def payload_for(self, packed: Packed, dst: str) -> Payload | None:
        """The payload to send to ``dst``, or None while no credit or pool space is free."""
        if self._pool is None or packed.nbytes <= self._cfg.inline_max_bytes:
            return Payload(meta=packed.meta, inline=packed.to_bytes() if packed.nbytes else b"")
        if self._per_peer.get(dst, 0) >= self._cfg.credits_per_peer:
            return None
        block = self._pool.acquire(packed.nbytes)
        if block is None:
            return None
        packed.write_into(block.view())
        ticket = next(self._tickets)
        self._in_flight[ticket] = (block, dst, time.monotonic() + self._cfg.ack_timeout_s)
        self._per_peer[dst] = self._per_peer.get(dst, 0) + 1
        ref = ShmRef(segment=block.segment.name, offset=0, nbytes=packed.nbytes, block_id=ticket)
        return Payload(meta=packed.meta, shm=ref)

    def on_ack(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self._free(block_id)

    def expire(self, now: float | None = None) -> list[int]:
        """Reclaim blocks whose ack is overdue (their consumer is gone or stuck)."""
        now = time.monotonic() if now is None else now
        overdue = [t for t, (_, _, deadline) in self._in_flight.items() if deadline <= now]
        for block_id in overdue:
            self._free(block_id)
        return overdue

    def forget_peer(self, dst: str) -> None:
        for ticket in [t for t, (_, peer, _) in self._in_flight.items() if peer == dst]:
            self._free(ticket)

    def _free(self, ticket: int) -> None:
        entry = self._in_flight.pop(ticket, None)
        if entry is None or self._pool is None:
            return  # a late or duplicate ack: already reclaimed
        block, peer, _ = entry
        self._per_peer[peer] -= 1
        self._pool.release(block)

    @property
    def blocks_in_flight(self) -> int:
        return len(self._in_flight)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close([block for block, _, _ in self._in_flight.values()])
            self._in_flight.clear()


class RelayReader:
    """Consumer side. ``release(producer, block_id)`` may be called from any thread."""

    def __init__(self, release: Callable[[str, int], None], zero_copy_min_bytes: int | None = 1 << 20,
                 max_attached: int = 256) -> None:
        self._release = release
        self._zero_copy_min = zero_copy_min_bytes
        self._attached: OrderedDict[str, shm.Segment] = OrderedDict()
        self._max_attached = max_attached
        # lease -> weak reference to the array every view of one block hangs off; its callback
        # acks the block (weakref.finalize does the same with far more code run per use)
        self._views: dict[int, weakref.ref] = {}
        self._leases = itertools.count()
        self._lock = threading.Lock()

    def decode(self, payload: Payload, producer: str) -> Any:
        if payload.shm is None:
            buffer = bytearray(payload.inline) if payload.inline else None
            return unpack(payload.meta, buffer, copy=False)
        ref = payload.shm
        segment = self._segment(ref.segment)
        window = memoryview(segment.buf)[ref.offset:ref.offset + ref.nbytes]
        if self._zero_copy_min is None or ref.nbytes < self._zero_copy_min:
            try:
                return unpack(payload.meta, window, copy=True)
            finally:
                self._release(producer, ref.block_id)
        return unpack(payload.meta, window, copy=False, on_view=lambda flat: self._watch(flat, producer, ref.block_id))

    def discard(self, payload: Payload | None, producer: str) -> None:
        """Give back a payload's block unread (its request was aborted)."""
        if payload is not None and payload.shm is not None:
            self._release(producer, payload.shm.block_id)

    def _watch(self, flat: np.ndarray, producer: str, block_id: int) -> None:
        lease = next(self._leases)
        with self._lock:
            self._views[lease] = weakref.ref(flat, lambda _: self._view_gone(lease, producer, block_id))

    def _view_gone(self, lease: int, producer: str, block_id: int) -> None:
        with self._lock:
            self._views.pop(lease, None)
        self._release(producer, block_id)

    @property
    def blocks_held(self) -> int:
        return len(self._views)

    def _segment(self, name: str) -> shm.Segment:
        segment = self._attached.get(name)
        if segment is None:
            segment = shm.Segment.attach(name)
            self._attached[name] = segment
            while len(self._attached) > self._max_attached:
                _, old = self._attached.popitem(last=False)
                old.close()
        else:
            self._attached.move_to_end(name)
        return segment

    def forget_segments(self, name_prefix: str) -> None:
        for name in [n for n in self._attached if n.startswith(name_prefix)]:
            self._attached.pop(name).close()

    def close(self) -> None:
        for segment in self._attached.values():
            segment.close()
        self._attached.clear()



class Outlet:
    """A producer's sending side: per-consumer FIFO of items waiting for credit, so per
    (request, consumer) order holds even when the pool or the credits run out."""

    def __init__(self, writer: RelayWriter, send: Callable[[str, DataReady], None]) -> None:
        self.writer = writer
        self._send = send
        self._pending: dict[str, deque[tuple[DataReady, Packed]]] = {}

    def submit(self, msg: DataReady, packed: Packed) -> None:
        self._pending.setdefault(msg.dst, deque()).append((msg, packed))
        self.flush(msg.dst)

    def flush(self, dst: str | None = None) -> None:
        for peer in [dst] if dst is not None else list(self._pending):
            queue = self._pending.get(peer)
            while queue:
                msg, packed = queue[0]
                payload = self.writer.payload_for(packed, peer)
                if payload is None:
                    break  # no credit yet: the next ack flushes again, in order
                queue.popleft()
                msg.payload = payload
                self._send(peer, msg)

    def on_ack(self, block_ids: list[int]) -> None:
        self.writer.on_ack(block_ids)
        self.flush()

    def expire(self) -> int:
        overdue = self.writer.expire()
        if overdue:
            self.flush()
        return len(overdue)

    def drop_request(self, request_id: str) -> None:
        for peer, queue in self._pending.items():
            self._pending[peer] = deque(item for item in queue if item[0].request_id != request_id)

    def forget_peer(self, dst: str) -> None:
        self._pending.pop(dst, None)
        self.writer.forget_peer(dst)
        self.flush()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def close(self) -> None:
        self._pending.clear()
        self.writer.close()

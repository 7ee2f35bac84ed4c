"""The data plane between processes on one host: shared-memory blocks with credits and acks.

Producer (``RelayWriter``): packs a value; small ones ride inline in the control message, larger
ones are written into a pooled shm block and only a reference travels. A block stays owned by
the producer until the consumer acks it; each consumer has ``credits_per_peer`` blocks in flight
at most. A block whose ack never comes (consumer gone) is reclaimed after ``ack_timeout_s``.

Consumer (``RelayReader``): rebuilds the value. Blocks under ``zero_copy_min_bytes`` are copied
out and acked at once; bigger ones are handed out as views and acked when the last view dies,
so a 16 MiB tensor crosses with one copy. A scheduler that keeps a big input across steps
should clone it, or it pins the producer's block.

Device medium (CUDA IPC): a payload for a consumer that runs on a GPU of this host keeps its
large device tensors on the device (see ``codec``). The writer copies them into one device block
of its own, exports it (``cuda_ipc``) and sends a ``CudaRef`` beside the host part; the block is a
lease in the same ledger as shm blocks (one credit, the same acks and ack timeout) and is also
freed when its request is aborted (``drop_request``), its consumer is forgotten, or the writer
closes. The reader copies the block into a tensor of its own and acks once that copy has run (a
thread waits for it, so the I/O thread never blocks on the GPU). Host payloads are unchanged.

Inside one process no relay is used: stages pass object references (see ``stage_host``).

One file: the writer and the reader are the two halves of one protocol (block layout, credits,
acks); a change to one is a change to the other.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duplex.config.pipeline import RelayConfig
from duplex.runtime import shm
from duplex.runtime.codec import Packed, pack, unpack
from duplex.runtime.cuda_ipc import CudaSeam, TorchCudaIpc
from duplex.runtime.messages import CudaRef, DataReady, Payload, ShmRef

log = logging.getLogger("duplex.relay")

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


@dataclass(eq=False)
class _Lease:
    """One use of a block by one consumer: an shm block or a device block (``device``: what the
    seam keeps alive)."""

    peer: str
    deadline: float
    request_id: str
    block: _Block | None = None
    device: Any = None


class RelayWriter:
    """Producer side. ``device_peers``: consumers on a GPU of this host, which get large device
    tensors over CUDA IPC (only with shared memory on, i.e. on one host, and ``cuda_ipc``)."""

    def __init__(self, owner_prefix: str, cfg: RelayConfig, use_shm: bool = True,
                 device_peers: Collection[str] = (), cuda: CudaSeam | None = None) -> None:
        self._cfg = cfg
        self._use_shm = use_shm
        self._pool = ShmPool(owner_prefix, cfg.pool_bytes) if use_shm else None
        self._device_peers = frozenset(device_peers) if use_shm and cfg.cuda_ipc else frozenset()
        self._cuda = cuda if cuda is not None or not self._device_peers else TorchCudaIpc()
        # ticket -> lease; a ticket names one use of a block, so a late ack for an earlier use
        # can never free the block's current use
        self._in_flight: dict[int, _Lease] = {}
        self._tickets = itertools.count(1)
        self._per_peer: dict[str, int] = {}

    def sends_device(self, dst: str) -> bool:
        return dst in self._device_peers

    def pack(self, value: Any, dst: str | None = None) -> Packed:
        """Pack for ``dst``: device tensors stay on their device only for a device peer."""
        if dst is None or dst not in self._device_peers:
            return pack(value)
        return pack(value, self._cuda, self._cfg.inline_max_bytes)

    def payload_for(self, packed: Packed, dst: str, request_id: str = "") -> Payload | None:
        """The payload to send to ``dst``, or None while no credit or pool space is free."""
        inline = self._pool is None or packed.nbytes <= self._cfg.inline_max_bytes
        if inline and not packed.device_nbytes:
            return Payload(meta=packed.meta, inline=packed.to_bytes() if packed.nbytes else b"")
        if self._per_peer.get(dst, 0) >= self._cfg.credits_per_peer:
            return None  # (a payload with an shm and a device block takes two: one past the limit at most)
        shm_ref = None
        if not inline:
            assert self._pool is not None
            block = self._pool.acquire(packed.nbytes)
            if block is None:
                return None
            packed.write_into(block.view())
            ticket = self._lease(dst, request_id, block=block)
            shm_ref = ShmRef(segment=block.segment.name, offset=0, nbytes=packed.nbytes, block_id=ticket)
        cuda_ref = self._export(packed, dst, request_id) if packed.device_nbytes else None
        host = packed.to_bytes() if inline and packed.nbytes else b""
        return Payload(meta=packed.meta, inline=host, shm=shm_ref, cuda=cuda_ref)

    def _export(self, packed: Packed, dst: str, request_id: str) -> CudaRef:
        """Copy the payload's device tensors into one fresh device block and share it."""
        import torch

        if self._cuda is None or dst not in self._device_peers:
            raise ValueError(f"device tensors packed for {dst!r}, which takes no device payloads")
        flat = torch.empty(packed.device_nbytes, dtype=torch.uint8, device=packed.device)
        for offset, raw in packed.device_buffers:
            flat[offset:offset + raw.numel()].copy_(raw)
        exported = self._cuda.export(flat)
        del flat  # the seam's keep is now the block's only owner
        ticket = self._lease(dst, request_id, device=exported.keep)
        return CudaRef(device=self._cuda.device_index(packed.device), handle=exported.handle,
                       offset=exported.offset, nbytes=packed.device_nbytes, event=exported.event, block_id=ticket)

    def _lease(self, dst: str, request_id: str, block: _Block | None = None, device: Any = None) -> int:
        ticket = next(self._tickets)
        deadline = time.monotonic() + self._cfg.ack_timeout_s
        self._in_flight[ticket] = _Lease(dst, deadline, request_id, block, device)
        self._per_peer[dst] = self._per_peer.get(dst, 0) + 1
        return ticket

    def on_ack(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self._free(block_id)

    def expire(self, now: float | None = None) -> list[int]:
        """Reclaim blocks whose ack is overdue (their consumer is gone or stuck)."""
        now = time.monotonic() if now is None else now
        overdue = [t for t, lease in self._in_flight.items() if lease.deadline <= now]
        for block_id in overdue:
            self._free(block_id)
        return overdue

    def forget_peer(self, dst: str) -> None:
        for ticket in [t for t, lease in self._in_flight.items() if lease.peer == dst]:
            self._free(ticket)

    def drop_request(self, request_id: str) -> int:
        """Free the device blocks of an aborted request now, without waiting for their acks (a
        consumer still copying one reads bytes of a request it drops anyway). Shm blocks wait for
        their acks as before: a consumer may hold zero-copy views of them."""
        tickets = [t for t, lease in self._in_flight.items()
                   if lease.request_id == request_id and lease.device is not None]
        for ticket in tickets:
            self._free(ticket)
        return len(tickets)

    def _free(self, ticket: int) -> None:
        lease = self._in_flight.pop(ticket, None)
        if lease is None:
            return  # a late or duplicate ack: already reclaimed
        self._per_peer[lease.peer] -= 1
        if lease.block is not None and self._pool is not None:
            self._pool.release(lease.block)
        if lease.device is not None and self._cuda is not None:
            self._cuda.free(lease.device)

    @property
    def blocks_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def device_blocks_in_flight(self) -> int:
        return sum(lease.device is not None for lease in self._in_flight.values())

    def close(self) -> None:
        for ticket in [t for t, lease in self._in_flight.items() if lease.device is not None]:
            self._free(ticket)
        if self._pool is not None:
            self._pool.close([lease.block for lease in self._in_flight.values() if lease.block is not None])
        self._in_flight.clear()


class _DeviceAcks:
    """Acks device blocks once the consumer's copy of them has run: a thread waits on each copy's
    event in turn (copies run in order on one stream), so the I/O thread never blocks on the GPU."""

    def __init__(self, cuda: CudaSeam, release: Callable[[str, int], None]) -> None:
        self._cuda = cuda
        self._release = release
        self._queue: queue.SimpleQueue[tuple[Any, str, int] | None] = queue.SimpleQueue()
        # one writer each (the reader's thread, this thread): no lock, and no count is lost
        self._queued = self._acked = 0
        self._thread = threading.Thread(target=self._run, name="relay-device-acks", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Copies not acked yet."""
        return self._queued - self._acked

    def after(self, done: Any, producer: str, block_id: int) -> None:
        self._queued += 1
        self._queue.put((done, producer, block_id))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            done, producer, block_id = item
            try:
                self._cuda.wait(done)
            except Exception:  # the producer frees the block on the ack either way
                log.exception("relay: waiting for a device copy failed")
            finally:
                self._release(producer, block_id)
                self._acked += 1

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)


class RelayReader:
    """Consumer side. ``release(producer, block_id)`` may be called from any thread."""

    def __init__(self, release: Callable[[str, int], None], zero_copy_min_bytes: int | None = 1 << 20,
                 max_attached: int = 256, cuda: CudaSeam | None = None) -> None:
        self._release = release
        self._zero_copy_min = zero_copy_min_bytes
        self._attached: OrderedDict[str, shm.Segment] = OrderedDict()
        self._max_attached = max_attached
        # lease -> weak reference to the array every view of one block hangs off; its callback
        # acks the block (weakref.finalize does the same with far more code run per use)
        self._views: dict[int, weakref.ref] = {}
        self._leases = itertools.count()
        self._lock = threading.Lock()
        self._cuda = cuda  # made on the first device payload: a host-only consumer never loads CUDA
        self._device_acks: _DeviceAcks | None = None

    def decode(self, payload: Payload, producer: str) -> Any:
        device_flat = self._device_block(payload.cuda, producer) if payload.cuda is not None else None
        if payload.shm is None:
            buffer = bytearray(payload.inline) if payload.inline else None
            return unpack(payload.meta, buffer, copy=False, device_flat=device_flat)
        ref = payload.shm
        segment = self._segment(ref.segment)
        window = memoryview(segment.buf)[ref.offset:ref.offset + ref.nbytes]
        if self._zero_copy_min is None or ref.nbytes < self._zero_copy_min:
            try:
                return unpack(payload.meta, window, copy=True, device_flat=device_flat)
            finally:
                self._release(producer, ref.block_id)
        return unpack(payload.meta, window, copy=False, on_view=lambda flat: self._watch(flat, producer, ref.block_id),
                      device_flat=device_flat)

    def _device_block(self, ref: CudaRef, producer: str) -> Any:
        """Our own copy of a producer's device block; its ack goes once the copy has run."""
        if self._cuda is None:
            self._cuda = TorchCudaIpc()
        if self._device_acks is None:
            self._device_acks = _DeviceAcks(self._cuda, self._release)
        try:
            flat, done = self._cuda.open_copy(producer, ref)
        except BaseException:
            self._release(producer, ref.block_id)
            raise
        self._device_acks.after(done, producer, ref.block_id)
        return flat

    def discard(self, payload: Payload | None, producer: str) -> None:
        """Give back a payload's blocks unread (its request was aborted)."""
        if payload is not None:
            for block_id in payload.block_ids:
                self._release(producer, block_id)

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
        return len(self._views) + (self._device_acks.pending if self._device_acks is not None else 0)

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

    def forget_producer(self, producer: str) -> None:
        """A producer was replaced: close what was opened of its device memory."""
        if self._cuda is not None:
            self._cuda.forget(producer)

    def close(self) -> None:
        for segment in self._attached.values():
            segment.close()
        self._attached.clear()
        if self._device_acks is not None:
            self._device_acks.close()
        if self._cuda is not None:
            self._cuda.close()



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
            waiting = self._pending.get(peer)
            while waiting:
                msg, packed = waiting[0]
                payload = self.writer.payload_for(packed, peer, msg.request_id)
                if payload is None:
                    break  # no credit yet: the next ack flushes again, in order
                waiting.popleft()
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
        for peer, waiting in self._pending.items():
            self._pending[peer] = deque(item for item in waiting if item[0].request_id != request_id)
        if self.writer.drop_request(request_id):
            self.flush()  # credits came back

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

"""The CUDA calls of the relay's device medium, and nothing else (the ledger, credits, acks and
aborts are ``relay``'s and run the same over a CPU stand-in of this seam in tests).

Producer: ``export`` shares a device block the relay filled (a fresh tensor, so nothing else
writes it) with torch's own CUDA IPC (``UntypedStorage._share_cuda_``): the handle of the
caching allocator's segment that holds it, the block's offset there, and an interprocess event
that torch records on the current stream right after the share. The block is kept alive by the
relay's ledger until the consumer acks; ``free`` lets it go.

Stream order: the relay fills the block on the producer's current stream and the event is
recorded after that fill, so it covers the fill and every kernel queued before it on that
stream (the kernels that made the tensor, when they ran on the same stream: a producer that
computes on a side stream must sync it with the current one first, as torch asks anywhere).
The consumer makes its own current stream wait on that event before its copy reads the block.
Past torch's limit of interprocess events in use, torch synchronizes the stream instead and the
event is empty.

torch counts consumers of a shared block in a file of counters: a block the producer drops while
its count is above zero waits in a limbo until a consumer's storage dies. The relay's acks
already say when a block is free, so the consumer opens handles with no counter (a name that
does not exist: its decrement is a no-op), and ``free`` drops the producer's count itself
before letting the block go. The allocator then frees it at once: device memory is back the
moment the ack (or an abort, or an expiry) reaches the ledger.

Consumer: ``open_copy`` maps the producer's segment once per (producer, handle) and keeps the
mapping open (opening is the expensive call), waits on the event, and copies the block into a
tensor of its own on the current stream: the producer's block is free as soon as that copy has
run (``wait``), a received tensor can be sent on like any other, and a consumer that keeps an
input for a long time pins nothing of the producer's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:  # no import at run time: scripts/gpu_probe.py uses this seam before any wheel is in
    from duplex.runtime.messages import CudaRef

_NO_COUNTER = b"/duplex-relay-no-counter"  # see the module doc: consumers hold no torch counter


class Exported(NamedTuple):
    handle: bytes
    offset: int
    event: bytes
    keep: Any  # what keeps the block alive until ``free``


class CudaSeam(Protocol):
    """The relay's device medium: the codec's questions plus the IPC calls."""

    def is_device(self, tensor: Any) -> bool: ...

    def device_name(self, tensor: Any) -> str: ...

    def device_index(self, device: str) -> int: ...

    def export(self, flat: Any) -> Exported: ...

    def free(self, keep: Any) -> None: ...

    def open_copy(self, producer: str, ref: CudaRef) -> tuple[Any, Any]: ...

    def wait(self, done: Any) -> None: ...

    def forget(self, producer: str) -> None: ...

    def close(self) -> None: ...


class TorchCudaIpc:
    """CUDA IPC through torch (no other CUDA library needed)."""

    def __init__(self, max_open: int = 256) -> None:
        # (producer, handle) -> storages over one opened mapping, the largest last
        self._open: OrderedDict[tuple[str, bytes], list[Any]] = OrderedDict()
        self._max_open = max_open

    # -- both sides ---------------------------------------------------------------------------
    def is_device(self, tensor: Any) -> bool:
        return bool(tensor.is_cuda)

    def device_name(self, tensor: Any) -> str:
        return f"cuda:{tensor.device.index or 0}"

    def device_index(self, device: str) -> int:
        return int(device.partition(":")[2] or 0)

    # -- producer -----------------------------------------------------------------------------
    def export(self, flat: Any) -> Exported:
        _, handle, _, offset, counter, counter_offset, event, synced_by_event = flat.untyped_storage()._share_cuda_()
        return Exported(handle=handle, offset=offset, event=event if synced_by_event else b"",
                        keep=(flat, counter, counter_offset))

    def free(self, keep: Any) -> None:
        import torch

        _, counter, counter_offset = keep
        # count zero before the last reference goes (the caller's ``keep``): then torch's deleter
        # frees the block at once instead of parking it in its limbo
        torch.UntypedStorage._release_ipc_counter_cuda(counter, counter_offset)

    # -- consumer -----------------------------------------------------------------------------
    def open_copy(self, producer: str, ref: CudaRef) -> tuple[Any, Any]:
        import torch

        with torch.cuda.device(ref.device):
            stream = torch.cuda.current_stream()
            if ref.event:
                stream.wait_event(torch.cuda.Event.from_ipc_handle(ref.device, ref.event))
            base = self._mapping(producer, ref)
            src = torch.empty(0, dtype=torch.uint8, device=f"cuda:{ref.device}")
            src.set_(base, ref.offset, (ref.nbytes,), (1,))
            out = torch.empty(ref.nbytes, dtype=torch.uint8, device=f"cuda:{ref.device}")
            out.copy_(src)
            done = torch.cuda.Event(blocking=True)  # its waiter sleeps, not spins, behind a long step
            done.record(stream)
        return out, done

    def _mapping(self, producer: str, ref: CudaRef) -> Any:
        """The producer's segment, opened once. A block lying past what was opened gets a larger
        storage over the same mapping (torch reuses an open handle while a storage of it lives);
        the smaller ones stay until the mapping closes: dropping one would sync the stream."""
        import torch

        key = (producer, ref.handle)
        bases = self._open.get(key)
        needed = ref.offset + ref.nbytes
        if bases is None or bases[-1].nbytes() < needed:
            base = torch.UntypedStorage._new_shared_cuda(ref.device, ref.handle, needed, 0, _NO_COUNTER, 0,
                                                        b"", False)
            bases = self._open.setdefault(key, [])
            bases.append(base)
            self._evict()
        self._open.move_to_end(key)
        return bases[-1]

    def _evict(self) -> None:
        if len(self._open) <= self._max_open:
            return
        import torch

        torch.cuda.synchronize()  # no copy of ours may still read a mapping we close
        while len(self._open) > self._max_open:
            self._open.popitem(last=False)

    def wait(self, done: Any) -> None:
        done.synchronize()

    def forget(self, producer: str) -> None:
        """The producer is gone (restarted): its handles mean nothing now."""
        for key in [k for k in self._open if k[0] == producer]:
            del self._open[key]

    def close(self) -> None:
        self._open.clear()

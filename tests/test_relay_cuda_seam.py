"""The relay's device medium (CUDA IPC) on the CPU: everything but the CUDA calls.

CUDA cannot run on this machine, so the CUDA call seam (``duplex.runtime.cuda_ipc``: export a
block, open and copy it, wait for the copy, free the block) is replaced by ``FakeCuda``, a CPU
stand-in that records its calls and keeps "device" blocks as CPU tensors in a dict both sides
share. That seam is the only fake here: the codec, the writer's ledger (credits, acks, the ack
timeout, aborts, forgotten peers, close), the reader's ack-after-copy thread, the outlet and the
control-plane message encoding are the real ones. The real seam runs in tests/gpu/.
"""

import itertools
import threading

import numpy as np
import pytest
import torch

from duplex.config.pipeline import RelayConfig
from duplex.runtime import messages as m
from duplex.runtime import shm
from duplex.runtime.cuda_ipc import Exported
from duplex.runtime.relay import Outlet, RelayReader, RelayWriter

GPU = "gpu-stage"  # a consumer on a GPU of this host
CPU = "cpu-stage"


class FakeDone:
    def __init__(self, ready: bool) -> None:
        self.ready = threading.Event()
        if ready:
            self.ready.set()


class FakeCuda:
    """CPU stand-in for the CUDA call seam: tensors marked ``on_fake_device`` are device tensors."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, torch.Tensor] = {}  # handle -> block ("device memory")
        self.calls: list[tuple] = []
        self.opened: set[tuple[str, bytes]] = set()
        self.hold_copies = False  # copies stay "running" until the test finishes them
        self.copies: list[FakeDone] = []
        self.fail_open = False
        self._handles = itertools.count(1)

    def is_device(self, tensor) -> bool:
        return bool(getattr(tensor, "on_fake_device", False))

    def device_name(self, tensor) -> str:
        return "cpu"

    def device_index(self, device: str) -> int:
        return 0

    def export(self, flat) -> Exported:
        handle = b"h%d" % next(self._handles)
        self.blocks[handle] = flat
        self.calls.append(("export", handle, flat.numel()))
        return Exported(handle=handle, offset=0, event=b"ev" + handle, keep=handle)

    def free(self, keep) -> None:
        self.calls.append(("free", keep))
        del self.blocks[keep]

    def open_copy(self, producer: str, ref: m.CudaRef):
        if self.fail_open:
            raise RuntimeError("cannot open the handle")
        self.calls.append(("open_copy", producer, ref.handle, ref.event))
        self.opened.add((producer, ref.handle))
        block = self.blocks[ref.handle]
        done = FakeDone(ready=not self.hold_copies)
        self.copies.append(done)
        return block[ref.offset:ref.offset + ref.nbytes].clone(), done

    def wait(self, done: FakeDone) -> None:
        assert done.ready.wait(10), "a copy never finished"

    def forget(self, producer: str) -> None:
        self.calls.append(("forget", producer))

    def close(self) -> None:
        self.calls.append(("close",))

    def live(self) -> int:
        return len(self.blocks)


class Acks:
    """The reader's release callback: records acks, and lets a test wait for the n-th."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int]] = []
        self._cond = threading.Condition()

    def __call__(self, producer: str, block_id: int) -> None:
        with self._cond:
            self.items.append((producer, block_id))
            self._cond.notify_all()

    def wait_for(self, n: int) -> list[tuple[str, int]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.items) >= n, timeout=10), self.items
            return list(self.items)


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    tensor.on_fake_device = True
    return tensor


@pytest.fixture
def side(request):
    prefix = f"duplex.{__import__('os').getpid()}-cuda{request.node.name[-8:]}.w."
    cuda = FakeCuda()
    cfg = RelayConfig(inline_max_bytes=1024, credits_per_peer=2, pool_bytes=8 << 20, ack_timeout_s=0.5)
    writer = RelayWriter(prefix, cfg, device_peers={GPU}, cuda=cuda)
    acks = Acks()
    reader = RelayReader(acks, zero_copy_min_bytes=1 << 16, cuda=cuda)
    yield writer, reader, cuda, acks
    reader.close()
    writer.close()
    assert cuda.live() == 0, "device blocks left after close"
    assert shm.list_segments(prefix) == []


def send(writer, value, dst=GPU, request_id="r1"):
    payload = writer.payload_for(writer.pack(value, dst), dst, request_id)
    assert payload is not None
    return payload


def test_a_large_device_tensor_crosses_as_a_device_block_and_is_freed_on_ack(side):
    writer, reader, cuda, acks = side
    hidden = on_device(torch.randn(64, 256))  # 64 KiB of float32
    payload = send(writer, {"hidden": hidden, "step": 3})
    assert payload.cuda is not None and payload.shm is None
    assert payload.cuda.nbytes == hidden.numel() * 4 and payload.cuda.event == b"ev" + payload.cuda.handle
    out = reader.decode(payload, "thinker")
    assert out["step"] == 3 and out["hidden"].dtype == torch.float32 and torch.equal(out["hidden"], hidden)
    assert acks.wait_for(1) == [("thinker", payload.cuda.block_id)]
    assert writer.device_blocks_in_flight == 1 and cuda.live() == 1  # the ack has not reached it yet
    writer.on_ack([payload.cuda.block_id])
    assert writer.blocks_in_flight == 0 and cuda.live() == 0


def test_the_ack_waits_for_the_consumers_copy(side):
    writer, reader, cuda, acks = side
    cuda.hold_copies = True
    payload = send(writer, on_device(torch.ones(4096)))
    out = reader.decode(payload, "thinker")
    assert torch.equal(out, torch.ones(4096))
    assert reader.blocks_held == 1 and acks.items == []  # the copy is still "running"
    cuda.copies[0].ready.set()
    assert acks.wait_for(1) == [("thinker", payload.cuda.block_id)]


def test_device_tensors_share_one_block_beside_host_data(side):
    writer, reader, cuda, acks = side
    a, b = on_device(torch.arange(300, dtype=torch.int64)), on_device(torch.randn(3, 100).to(torch.bfloat16))
    host = np.arange(20_000, dtype=np.float32)  # 80 KiB: rides in shm
    payload = send(writer, {"a": a, "b": b, "host": host})
    assert payload.shm is not None and payload.cuda is not None and len(payload.block_ids) == 2
    assert [c[0] for c in cuda.calls] == ["export"]  # one device block for both tensors
    out = reader.decode(payload, "p")
    assert torch.equal(out["a"], a) and torch.equal(out["b"], b) and out["b"].dtype == torch.bfloat16
    assert np.array_equal(out["host"], host)


def test_small_device_tensors_ride_inline_and_come_back_on_their_device(side):
    writer, reader, cuda, acks = side
    codes = on_device(torch.tensor([[1, 2, 3, 4]]))
    payload = send(writer, {"codes": codes})
    assert payload.cuda is None and payload.shm is None and cuda.calls == []
    assert torch.equal(reader.decode(payload, "p")["codes"], codes)


def test_a_consumer_off_the_gpu_gets_host_tensors(side):
    writer, reader, cuda, acks = side
    payload = send(writer, on_device(torch.randn(128, 128)), dst=CPU)
    assert payload.cuda is None and payload.shm is not None and cuda.calls == []
    assert isinstance(reader.decode(payload, "p"), torch.Tensor)


def test_device_blocks_take_credits_and_acks_return_them(side):
    writer, reader, cuda, acks = side
    packed = writer.pack(on_device(torch.zeros(10_000)), GPU)
    first, second = writer.payload_for(packed, GPU, "r1"), writer.payload_for(packed, GPU, "r1")
    assert first and second and writer.payload_for(packed, GPU, "r1") is None  # out of credit
    writer.on_ack([first.cuda.block_id])
    assert writer.payload_for(packed, GPU, "r1") is not None
    writer.on_ack([first.cuda.block_id])  # a duplicate ack changes nothing
    assert writer.device_blocks_in_flight == 2 and cuda.live() == 2


def test_an_abort_frees_that_requests_device_blocks_at_once(side):
    writer, reader, cuda, acks = side
    big = on_device(torch.zeros(10_000))
    mine, other = send(writer, big, request_id="aborted"), send(writer, big, request_id="other")
    shm_block = writer.payload_for(writer.pack(np.zeros(100_000, np.uint8), GPU), "third", "aborted")
    assert writer.drop_request("aborted") == 1
    assert cuda.live() == 1 and ("free", mine.cuda.handle) in cuda.calls
    assert writer.blocks_in_flight == 2  # the other request's block, and the shm block (waits for its ack)
    writer.on_ack([mine.cuda.block_id])  # the consumer's late ack is harmless
    assert writer.blocks_in_flight == 2
    writer.on_ack([other.cuda.block_id, shm_block.shm.block_id])
    assert writer.blocks_in_flight == 0 and cuda.live() == 0


def test_overdue_and_forgotten_device_blocks_are_freed(side):
    writer, reader, cuda, acks = side
    big = on_device(torch.zeros(10_000))
    overdue = send(writer, big)
    assert writer.expire(now=float("inf")) == [overdue.cuda.block_id] and cuda.live() == 0
    send(writer, big)
    writer.forget_peer(GPU)
    assert writer.blocks_in_flight == 0 and cuda.live() == 0


def test_close_frees_device_blocks_in_flight(side):
    writer, reader, cuda, acks = side
    send(writer, on_device(torch.zeros(10_000)))
    assert cuda.live() == 1  # the fixture checks close() leaves none


def test_discarding_a_payload_acks_all_its_blocks_unread(side):
    writer, reader, cuda, acks = side
    payload = send(writer, {"d": on_device(torch.zeros(10_000)), "h": np.zeros(100_000, np.uint8)})
    reader.discard(payload, "p")
    assert sorted(b for _, b in acks.items) == sorted(payload.block_ids)
    assert not any(call[0] == "open_copy" for call in cuda.calls)


def test_a_block_that_cannot_be_opened_is_still_acked(side):
    writer, reader, cuda, acks = side
    cuda.fail_open = True
    payload = send(writer, on_device(torch.zeros(10_000)))
    with pytest.raises(RuntimeError, match="cannot open"):
        reader.decode(payload, "p")
    assert acks.items == [("p", payload.cuda.block_id)]


def test_a_restarted_producer_is_forgotten_by_the_reader(side):
    writer, reader, cuda, acks = side
    reader.decode(send(writer, on_device(torch.zeros(10_000))), "talker")
    reader.forget_producer("talker")
    assert ("forget", "talker") in cuda.calls


def test_the_outlet_drops_an_aborted_requests_waiting_and_sent_device_blocks(side):
    writer, reader, cuda, acks = side
    sent: list[m.DataReady] = []
    outlet = Outlet(writer, lambda dst, msg: sent.append(msg))
    big = on_device(torch.zeros(10_000))

    def submit(rid: str, seq: int) -> None:
        msg = m.DataReady(request_id=rid, src="p", dst=GPU, seq=seq, eos=False, payload=None, sent_ns=0)
        outlet.submit(msg, writer.pack(big, GPU))

    for seq in range(3):
        submit("aborted", seq)
    submit("kept", 0)
    assert [s.seq for s in sent] == [0, 1] and outlet.waiting == 2  # two credits
    outlet.drop_request("aborted")
    assert [(s.request_id, s.seq) for s in sent] == [("aborted", 0), ("aborted", 1), ("kept", 0)]
    assert outlet.waiting == 0 and writer.device_blocks_in_flight == 1 and cuda.live() == 1


def test_a_device_payload_survives_the_control_plane_encoding():
    ref = m.CudaRef(device=1, handle=bytes(range(64)), offset=4096, nbytes=16 << 20, event=b"\x01" * 64,
                    block_id=7)
    msg = m.DataReady(request_id="r", src="a", dst="b", seq=0, eos=True, sent_ns=1,
                      payload=m.Payload(meta=b"\x00\xc0", cuda=ref))
    back = m.decode(m.encode(msg))
    assert isinstance(back, m.DataReady) and back.payload.cuda == ref and back.payload.block_ids == [7]


def test_device_ipc_needs_shared_memory_and_can_be_turned_off():
    cuda = FakeCuda()
    value = on_device(torch.zeros(10_000))
    for writer in (RelayWriter("duplex.x.", RelayConfig(), use_shm=False, device_peers={GPU}, cuda=cuda),
                   RelayWriter("duplex.y.", RelayConfig(cuda_ipc=False), device_peers={GPU}, cuda=cuda)):
        assert not writer.sends_device(GPU)
        payload = writer.payload_for(writer.pack(value, GPU), GPU)
        assert payload.cuda is None and cuda.calls == []
        writer.close()

import gc

import numpy as np
import pytest
import torch

from duplex.config.pipeline import RelayConfig
from duplex.runtime import shm
from duplex.runtime.codec import pack, unpack
from duplex.runtime.relay import RelayReader, RelayWriter


@pytest.fixture
def relay(request):
    prefix = f"duplex.{__import__('os').getpid()}-test{request.node.name[-8:]}.w."
    released: list[tuple[str, int]] = []
    writer = RelayWriter(prefix, RelayConfig(inline_max_bytes=1024, credits_per_peer=2, pool_bytes=8 << 20,
                                             ack_timeout_s=0.5))
    reader = RelayReader(lambda producer, block: released.append((producer, block)), zero_copy_min_bytes=1 << 16)
    yield writer, reader, released
    reader.close()
    writer.close()
    assert shm.list_segments(prefix) == []


def roundtrip(writer, reader, value, dst="b"):
    payload = writer.payload_for(pack(value), dst)
    assert payload is not None
    return payload, reader.decode(payload, "a")


def test_codec_keeps_dtypes_shapes_and_values():
    value = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "i16": np.array([-3, 7], dtype=np.int16),
        "strided": np.arange(20)[::3],
        "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "long": torch.tensor([[1, 2], [3, 4]]),
        "empty": torch.zeros(0, 5),
        "nested": [{"text": "hi", "n": 3, "ok": True, "none": None}],
    }
    packed = pack(value)
    out = unpack(packed.meta, bytearray(packed.to_bytes()), copy=False)
    assert out["f32"].dtype == np.float32 and np.array_equal(out["f32"], value["f32"])
    assert np.array_equal(out["strided"], value["strided"])
    assert out["bf16"].dtype == torch.bfloat16 and torch.equal(out["bf16"], value["bf16"])
    assert torch.equal(out["long"], value["long"]) and out["empty"].shape == (0, 5)
    assert out["nested"] == value["nested"]


def test_codec_refuses_objects_it_cannot_send_without_pickle():
    with pytest.raises(TypeError, match="cannot send a object"):
        pack({"x": object()})


def test_small_payloads_ride_inline(relay):
    writer, reader, released = relay
    payload, out = roundtrip(writer, reader, {"a": np.ones(10, np.float32)})
    assert payload.shm is None and writer.blocks_in_flight == 0
    assert np.array_equal(out["a"], np.ones(10, np.float32))


def test_medium_payload_is_copied_and_acked_at_once(relay):
    writer, reader, released = relay
    data = np.arange(4096, dtype=np.float64)  # 32 KiB: above inline, below zero copy
    payload, out = roundtrip(writer, reader, data)
    assert payload.shm is not None
    assert released == [("a", payload.shm.block_id)]
    writer.on_ack([b for _, b in released])
    assert writer.blocks_in_flight == 0
    assert np.array_equal(out, data)


def test_large_payload_is_a_view_released_when_dropped(relay):
    writer, reader, released = relay
    data = torch.randn(256, 1024)  # 1 MiB
    payload, out = roundtrip(writer, reader, data)
    assert torch.equal(out, data)
    assert reader.blocks_held == 1 and released == []
    del out
    gc.collect()
    assert reader.blocks_held == 0 and released == [("a", payload.shm.block_id)]


def test_credits_bound_blocks_in_flight_and_acks_return_them(relay):
    writer, reader, released = relay
    big = pack(np.zeros(100_000, np.uint8))
    first, second = writer.payload_for(big, "b"), writer.payload_for(big, "b")
    assert first and second and writer.payload_for(big, "b") is None  # out of credit for b
    assert writer.payload_for(big, "c") is not None  # credit is per consumer
    writer.on_ack([first.shm.block_id])
    again = writer.payload_for(big, "b")
    assert again is not None and again.shm.segment == first.shm.segment  # the freed block is reused
    writer.on_ack([first.shm.block_id])  # a duplicate ack changes nothing
    assert writer.blocks_in_flight == 3


def test_overdue_blocks_are_reclaimed(relay):
    writer, reader, released = relay
    payload = writer.payload_for(pack(np.zeros(100_000, np.uint8)), "b")
    assert writer.expire(now=0) == []
    assert writer.expire(now=float("inf")) == [payload.shm.block_id]
    assert writer.blocks_in_flight == 0


def test_forgetting_a_peer_frees_its_blocks(relay):
    writer, reader, released = relay
    big = pack(np.zeros(100_000, np.uint8))
    writer.payload_for(big, "b")
    writer.payload_for(big, "c")
    writer.forget_peer("b")
    assert writer.blocks_in_flight == 1


def test_payload_larger_than_pool_is_refused(relay):
    writer, reader, released = relay
    with pytest.raises(ValueError, match="exceeds the relay pool"):
        writer.payload_for(pack(np.zeros(9 << 20, np.uint8)), "b")

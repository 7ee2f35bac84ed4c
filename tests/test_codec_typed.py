"""The codec brings contract items and family structs back as themselves, arrays zero-copy."""

from typing import Any

import numpy as np
import pytest
import torch

from duplex.runtime.codec import pack, unpack
from duplex.runtime.contract import AgentAudio, AgentText, CallerAudio, Payload, Transcript


class _Frames(Payload, tag="test_codec.Frames"):
    """A family's own struct, defined after the codec built its decoder once."""

    codes: Any
    hidden: Any = None
    start: int = 0


class _Voiced(AgentAudio, tag="test_codec.Voiced"):
    """A family's subclass of a contract item: the client sees an AgentAudio, the family more."""

    codes: Any = None


def _roundtrip(value, copy=False):
    packed = pack(value)
    return unpack(packed.meta, packed.to_bytes(), copy=copy)


def test_contract_items_come_back_typed_and_equal():
    samples = np.linspace(-1, 1, 480, dtype=np.float32)
    for item in (CallerAudio(samples, [True, False], frame_ms=20), Transcript("hi there", final=True),
                 AgentText(" world"), AgentAudio(samples, 22050, "Sure,")):
        out = _roundtrip(item)
        assert type(out) is type(item)
        for field in item.__struct_fields__:
            got, want = getattr(out, field), getattr(item, field)
            assert np.array_equal(got, want) if isinstance(want, np.ndarray) else got == want, field


def test_arrays_inside_a_struct_are_views_of_the_buffer():
    samples = np.arange(1 << 16, dtype=np.float32)
    packed = pack(CallerAudio(samples))
    buffer = bytearray(packed.to_bytes())
    watched = []
    out = unpack(packed.meta, buffer, copy=False, on_view=watched.append)
    assert isinstance(out, CallerAudio) and np.array_equal(out.samples, samples)
    assert np.shares_memory(out.samples, watched[0])  # no copy: the struct holds a view
    buffer[0:4] = np.float32(42).tobytes()
    assert out.samples[0] == 42


def test_family_structs_and_subclasses_of_items_decode_as_themselves():
    codes = torch.arange(32).reshape(16, 2)
    hidden = np.ones((2, 8), np.float16)
    frames = _roundtrip(_Frames(codes, hidden, start=7), copy=True)
    assert isinstance(frames, _Frames) and frames.start == 7
    assert torch.equal(frames.codes, codes) and frames.hidden.dtype == np.float16
    voiced = _roundtrip(_Voiced(np.zeros(4, np.float32), 24000, "a", codes=np.ones((16, 1), np.int64)))
    assert isinstance(voiced, _Voiced) and isinstance(voiced, AgentAudio) and voiced.codes.shape == (16, 1)


def test_other_values_decode_generically():
    value = {"text": "x", "blob": np.ones(3, np.uint8), "items": [1, "two"]}
    out = _roundtrip(value)
    assert type(out) is dict and out["items"] == [1, "two"] and np.array_equal(out["blob"], value["blob"])
    assert _roundtrip(None) is None


def test_a_meta_of_unknown_kind_is_refused():
    packed = pack(AgentText("x"))
    with pytest.raises(ValueError, match="unknown payload kind"):
        unpack(b"\x07" + packed.meta[1:], b"", copy=True)


def test_an_array_whose_bytes_are_missing_fails_instead_of_reading_garbage() -> None:
    packed = pack({"audio": np.arange(64, dtype=np.float32)})
    with pytest.raises(ValueError, match="outside its 0-byte buffer"):
        unpack(packed.meta, None, copy=True)
    with pytest.raises(ValueError, match="outside its 16-byte buffer"):
        unpack(packed.meta, packed.to_bytes()[:16], copy=True)


def test_packing_goes_on_while_another_thread_is_still_importing_torch(monkeypatch):
    """A model loading on a worker thread imports torch; until that import is done, sys.modules
    holds a half-made module without ``Tensor``. The session's audio (with the VAD's np.bool_
    verdicts) and a tensor-free struct must still pack (this killed a call's audio input once)."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # what a half-done import leaves
    audio = CallerAudio(samples=np.zeros(320, np.float32), voiced=[np.bool_(True), np.bool_(False)])
    back = _roundtrip(audio)
    assert back.voiced == [True, False] and back.samples.shape == (320,)
    assert _roundtrip({"n": np.int16(3), "flag": np.bool_(True)}) == {"n": 3, "flag": True}

"""Turn a payload into msgpack metadata plus raw tensor bytes, and back, without pickling.

Numpy arrays and torch tensors become msgpack extension values that describe where their bytes
lie in one flat buffer (64-byte aligned); everything else is plain msgpack. Tuples come back as
lists. Decoding can hand out views of the buffer (zero copy) or copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import numpy as np

_EXT_NUMPY = 1
_EXT_TORCH = 2
ALIGN = 64


@dataclass
class Packed:
    meta: bytes
    buffers: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (offset, uint8 array)
    nbytes: int = 0  # total size of the flat buffer

    def write_into(self, target: memoryview | bytearray | Any, base: int = 0) -> None:
        view = np.frombuffer(target, dtype=np.uint8)
        for offset, data in self.buffers:
            start = base + offset
            np.copyto(view[start:start + data.nbytes], data)

    def to_bytes(self) -> bytes:
        out = bytearray(self.nbytes)
        self.write_into(out)
        return bytes(out)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack(value: Any) -> Packed:
    packed = Packed(meta=b"")

    def add_buffer(raw: np.ndarray) -> int:
        offset = packed.nbytes
        packed.buffers.append((offset, raw))
        packed.nbytes = _align(offset + raw.nbytes)
        return offset

    def enc_hook(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            array = np.ascontiguousarray(obj)
            raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
            offset = add_buffer(raw)
            desc = (array.dtype.str, list(array.shape), offset, raw.nbytes)
            return msgspec.msgpack.Ext(_EXT_NUMPY, msgspec.msgpack.encode(desc))
        torch = _torch_if_loaded()
        if torch is not None and isinstance(obj, torch.Tensor):
            tensor = obj.detach().to("cpu").contiguous()
            raw = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
            offset = add_buffer(raw)
            desc = (str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, raw.nbytes)
            return msgspec.msgpack.Ext(_EXT_TORCH, msgspec.msgpack.encode(desc))
        if isinstance(obj, (np.generic,)):
            return obj.item()
        raise TypeError(f"cannot send a {type(obj).__name__} between stages")

    packed.meta = msgspec.msgpack.Encoder(enc_hook=enc_hook).encode(value)
    return packed


def unpack(meta: bytes, buffer: Any, copy: bool, on_view: Callable[[np.ndarray], None] | None = None) -> Any:
    """Rebuild a payload. ``buffer`` holds the tensor bytes (bytes, bytearray or an mmap).

    With ``copy=False`` arrays are views of ``buffer``: ``on_view`` receives the one uint8 array
    all views hang off, so the caller can learn (by weakref) when the last view is gone.
    """
    flat = None
    if buffer is not None and len(buffer):
        flat = np.frombuffer(buffer, dtype=np.uint8)
        if copy:
            flat = flat.copy()
        elif on_view is not None:
            on_view(flat)

    def ext_hook(code: int, data: memoryview) -> Any:
        dtype_name, shape, offset, nbytes = msgspec.msgpack.decode(data)
        raw = flat[offset:offset + nbytes] if nbytes else np.empty(0, np.uint8)
        if code == _EXT_NUMPY:
            return raw.view(np.dtype(dtype_name)).reshape(shape)
        if code == _EXT_TORCH:
            import torch

            dtype = getattr(torch, dtype_name)
            if not nbytes:
                return torch.empty(shape, dtype=dtype)
            return torch.from_numpy(raw).view(dtype).reshape(shape)
        raise ValueError(f"unknown payload extension {code}")

    return msgspec.msgpack.Decoder(ext_hook=ext_hook).decode(meta)


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")

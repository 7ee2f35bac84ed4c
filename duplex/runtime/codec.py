"""Turn a payload into msgpack metadata plus raw tensor bytes, and back, without pickling.

Numpy arrays and torch tensors become msgpack extension values that describe where their bytes
lie in one flat buffer (64-byte aligned); everything else is plain msgpack. Tuples come back as
lists. Decoding can hand out views of the buffer (zero copy) or copies.

The meta's first byte says how to read the rest: a ``contract.Payload`` (a contract item or a
family's struct) is decoded typed, as itself, by a decoder over every ``Payload`` subclass
(rebuilt when a module defines a new one); any other value generically (dicts, lists, scalars).
Arrays inside a struct take the same zero-copy extension path as anywhere else.

Each thread keeps one msgspec encoder and decoder and reuses them: a stage packs or unpacks one
value per hop, usually on a core that just woke up, where building a new (de)coder costs tens of
microseconds of cold code.

Device tensors (CUDA): by default they travel like host tensors (copied to the host, arriving on
the host, as before). Packed ``for_device`` (the consumer is a stage on a GPU of this host), a
device tensor over ``inline_max`` bytes stays on its device: it is kept as a flat byte view in
``Packed.device_buffers`` (the relay copies them into one device block and sends a CUDA IPC
reference), and the consumer gets it back on the device; a smaller one rides with the host bytes
(one device-to-host copy beats an IPC export, an event and an ack) and is put back on its device.
Which tensors count as device tensors is the ``DeviceSeam``'s call (``duplex.runtime.cuda_ipc``).
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np

from duplex.runtime.contract import Payload, payload_generation, payload_types

_GENERIC = b"\x00"  # meta kinds: plain msgpack ...
_TYPED = b"\x01"  # ... or a tagged Payload struct
_EXT_NUMPY = 1
_EXT_TORCH = 2
_EXT_DEVICE = 3  # a tensor in the payload's device block (CUDA IPC)
_EXT_TORCH_ON = 4  # a small device tensor carried with the host bytes; back onto its device
ALIGN = 64


class DeviceSeam(Protocol):
    """What the codec asks of a device: which tensors live on one, and its name."""

    def is_device(self, tensor: Any) -> bool: ...

    def device_name(self, tensor: Any) -> str: ...


@dataclass
class Packed:
    meta: bytes
    buffers: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (offset, uint8 array)
    nbytes: int = 0  # total size of the flat buffer
    # device tensors that stay on their device: (offset, flat uint8 tensor) in one device block
    device_buffers: list[tuple[int, Any]] = field(default_factory=list)
    device_nbytes: int = 0
    device: str = ""  # where the device block lives (one device per payload)

    def write_into(self, target: np.ndarray | memoryview | bytearray | Any, base: int = 0) -> None:
        view = target if isinstance(target, np.ndarray) else np.frombuffer(target, dtype=np.uint8)
        for offset, data in self.buffers:
            start = base + offset
            np.copyto(view[start:start + data.nbytes], data)

    def to_bytes(self) -> bytes:
        out = bytearray(self.nbytes)
        self.write_into(out)
        return bytes(out)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


_EMPTY = Packed(meta=b"")


class _Packer:
    """A reusable encoder; ``packed`` is the value being packed (one at a time per thread)."""

    def __init__(self) -> None:
        self.packed = _EMPTY
        self.encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self.device: DeviceSeam | None = None  # set while packing for a consumer on a device
        self.inline_max = 0

    def pack(self, value: Any, device: DeviceSeam | None = None, inline_max: int = 0) -> Packed:
        packed = self.packed = Packed(meta=b"")
        self.device, self.inline_max = device, inline_max
        kind = _TYPED if isinstance(value, Payload) else _GENERIC
        try:
            packed.meta = kind + self.encoder.encode(value)
        finally:
            self.packed = _EMPTY  # the packer must not keep the value's arrays alive
            self.device = None
        return packed

    def _add_buffer(self, raw: np.ndarray) -> int:
        packed = self.packed
        offset = packed.nbytes
        packed.buffers.append((offset, raw))
        packed.nbytes = _align(offset + raw.nbytes)
        return offset

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            array = np.ascontiguousarray(obj)
            raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
            offset = self._add_buffer(raw)
            desc = (array.dtype.str, list(array.shape), offset, raw.nbytes)
            return msgspec.msgpack.Ext(_EXT_NUMPY, msgspec.msgpack.encode(desc))
        if isinstance(obj, np.generic):  # a numpy scalar (the VAD's np.bool_ verdicts)
            return obj.item()
        torch = _torch_if_loaded()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj, torch)
        raise TypeError(f"cannot send a {type(obj).__name__} between stages")

    def _tensor(self, obj: Any, torch: Any) -> msgspec.msgpack.Ext:
        on_device = self.device is not None and self.device.is_device(obj)
        if on_device and obj.numel() * obj.element_size() > self.inline_max:
            return self._device_tensor(obj.detach())
        tensor = obj.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
        offset = self._add_buffer(raw)
        desc = (str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, raw.nbytes)
        if not on_device:
            return msgspec.msgpack.Ext(_EXT_TORCH, msgspec.msgpack.encode(desc))
        assert self.device is not None
        return msgspec.msgpack.Ext(_EXT_TORCH_ON, msgspec.msgpack.encode((*desc, self.device.device_name(obj))))

    def _device_tensor(self, tensor: Any) -> msgspec.msgpack.Ext:
        import torch

        assert self.device is not None
        packed, device = self.packed, self.device.device_name(tensor)
        if packed.device and packed.device != device:
            raise TypeError(f"a payload's device tensors must share one device ({packed.device}, {device})")
        packed.device = device
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)  # no copy yet: the relay copies once
        offset = packed.device_nbytes
        packed.device_buffers.append((offset, raw))
        packed.device_nbytes = _align(offset + raw.numel())
        desc = (str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, raw.numel())
        return msgspec.msgpack.Ext(_EXT_DEVICE, msgspec.msgpack.encode(desc))


class _Unpacker:
    """A reusable decoder; ``flat`` is the buffer of the payload being unpacked."""

    def __init__(self) -> None:
        self.flat: np.ndarray | None = None
        self.device_flat: Any = None  # the payload's device block, a flat uint8 tensor
        self.decoder = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)
        self._typed: msgspec.msgpack.Decoder | None = None
        self._typed_generation = -1

    def unpack(self, meta: bytes, flat: np.ndarray | None, device_flat: Any = None) -> Any:
        kind, body = meta[:1], memoryview(meta)[1:]
        decoder = self.decoder if kind == _GENERIC else self._typed_decoder() if kind == _TYPED else None
        if decoder is None:
            raise ValueError(f"unknown payload kind {kind!r}")
        self.flat, self.device_flat = flat, device_flat
        try:
            return decoder.decode(body)
        finally:
            self.flat = self.device_flat = None  # the decoder must not keep a (zero-copy) buffer alive

    def _typed_decoder(self) -> msgspec.msgpack.Decoder:
        generation = payload_generation()
        if self._typed is None or generation != self._typed_generation:
            types = payload_types()
            union = functools.reduce(operator.or_, types)
            self._typed = msgspec.msgpack.Decoder(union, ext_hook=self._ext_hook)
            self._typed_generation = generation
        return self._typed

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == _EXT_DEVICE:
            return self._device_tensor(*msgspec.msgpack.decode(data))
        if code == _EXT_TORCH_ON:
            *desc, device = msgspec.msgpack.decode(data)
            return _onto(self._array(_EXT_TORCH, *desc), device)
        return self._array(code, *msgspec.msgpack.decode(data))

    def _device_tensor(self, dtype_name: str, shape: list[int], offset: int, nbytes: int) -> Any:
        import torch

        flat = self.device_flat
        if flat is None or offset + nbytes > flat.numel():
            have = 0 if flat is None else flat.numel()
            raise ValueError(f"device tensor of {nbytes} bytes at {offset} lies outside its {have}-byte block")
        return flat[offset:offset + nbytes].view(getattr(torch, dtype_name)).reshape(shape)

    def _array(self, code: int, dtype_name: str, shape: list[int], offset: int, nbytes: int) -> Any:
        if nbytes and (self.flat is None or offset + nbytes > len(self.flat)):
            # np.ndarray(buffer=None) would hand out uninitialised memory instead of failing
            have = 0 if self.flat is None else len(self.flat)
            raise ValueError(f"payload array of {nbytes} bytes at {offset} lies outside its {have}-byte buffer")
        if code == _EXT_NUMPY and nbytes:  # one call; its base is ``flat``, which callers watch
            return np.ndarray(shape, dtype=dtype_name, buffer=self.flat, offset=offset)
        if nbytes:
            assert self.flat is not None  # checked above
            raw = self.flat[offset:offset + nbytes]
        else:
            raw = np.empty(0, np.uint8)
        if code == _EXT_NUMPY:
            return raw.view(np.dtype(dtype_name)).reshape(shape)
        if code == _EXT_TORCH:
            import torch

            dtype = getattr(torch, dtype_name)
            if not nbytes:
                return torch.empty(shape, dtype=dtype)
            return torch.from_numpy(raw).view(dtype).reshape(shape)
        raise ValueError(f"unknown payload extension {code}")


def _onto(tensor: Any, device: str) -> Any:
    """A small host tensor back onto its GPU without blocking: a plain copy from pageable memory
    would wait for every kernel queued on the device, a pinned one is queued behind them."""
    if not device.startswith("cuda"):
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


_per_thread = threading.local()


def pack(value: Any, device: DeviceSeam | None = None, inline_max: int = 0) -> Packed:
    """Pack ``value``; with ``device``, device tensors over ``inline_max`` bytes stay on it."""
    packer = getattr(_per_thread, "packer", None)
    if packer is None:
        packer = _per_thread.packer = _Packer()
    return packer.pack(value, device, inline_max)


def unpack(meta: bytes, buffer: Any, copy: bool, on_view: Callable[[np.ndarray], None] | None = None,
           device_flat: Any = None) -> Any:
    """Rebuild a payload. ``buffer`` holds the tensor bytes (bytes, bytearray or an mmap);
    ``device_flat`` the device block's bytes (the consumer's own copy), if the payload has one.

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
    unpacker = getattr(_per_thread, "unpacker", None)
    if unpacker is None:
        unpacker = _per_thread.unpacker = _Unpacker()
    return unpacker.unpack(meta, flat, device_flat)


def _torch_if_loaded():
    """torch, if it is imported (and done importing): no tensor exists before then. Another thread
    may be importing it (a model loading on a worker thread) while this one packs a payload; its
    half-made module has no ``Tensor`` yet."""
    import sys

    torch = sys.modules.get("torch")
    return torch if hasattr(torch, "Tensor") else None

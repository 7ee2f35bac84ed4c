"""Per-slot K/V storage for continuous batching, handed to a transformers decoder as ``cache=``.

Which request holds which slot is the ``ar`` scheduler's business (its ``SlotPool``); this class
only stores tensors, for any decoder family. Each slot owns ``max_len`` positions in one
preallocated tensor per layer, so admitting, finishing or aborting a request never reallocates.

One forward call may mix rows at different lengths and with different numbers of new tokens:
``SlotBatch`` carries each row's slot, start and count, and the attention masks (causal, and
sliding-window where the model has such layers) are built from those, so positions never come
from state stored on a module. Stale K/V past a row's end is never attended to, so a freed slot
needs no clearing. transformers only calls ``update``.

Models reach this module through ``duplex.runtime.contract`` (it imports torch, so the contract
loads it only when a stage asks for it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KVPrefix = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v): [kv_heads, length, head_dim]


@dataclass(frozen=True)
class SlotBatch:
    """Row b writes ``q_lens[b]`` new positions from ``starts[b]`` into slot ``slots[b]``; rows
    shorter than the longest are padded at the end."""

    slots: torch.Tensor  # (B,) long
    starts: torch.Tensor  # (B,) long
    q_lens: torch.Tensor  # (B,) long

    @staticmethod
    def of(slots: list[int], starts: list[int], q_lens: list[int]) -> SlotBatch:
        def as_long(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long)

        return SlotBatch(as_long(slots), as_long(starts), as_long(q_lens))

    @property
    def q_len(self) -> int:
        return int(self.q_lens.max())

    @property
    def kv_len(self) -> int:
        return int((self.starts + self.q_lens).max())

    def position_ids(self) -> torch.Tensor:
        """(B, q) absolute positions; padding queries repeat their row's last real position."""
        offsets = torch.arange(self.q_len)[None, :]
        return self.starts[:, None] + torch.minimum(offsets, self.q_lens[:, None] - 1)


class SlotKVCache:
    """Preallocated per-layer K/V ``[slots, kv_heads, max_len + 1, head_dim]``: the one spare
    column per slot takes the writes of padding queries."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: str = "cpu", sliding_window: int | None = None) -> None:
        shape = (num_slots, num_kv_heads, max_len + 1, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len, self.device = num_slots, max_len, device
        self.sliding_window = sliding_window
        self._batch: SlotBatch | None = None
        self._write_pos: torch.Tensor | None = None

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype_bytes: int = 4) -> int:
        return 2 * num_layers * num_kv_heads * (max_len + 1) * head_dim * dtype_bytes

    # -- prefixes -------------------------------------------------------------------------------
    def copy_prefix(self, slot: int, prefix: KVPrefix) -> None:
        """Write a precomputed prefix (per layer (k, v) of shape [kv_heads, P, head_dim]) at 0..P."""
        for layer, (k, v) in enumerate(prefix):
            length = k.shape[1]
            self.keys[layer][slot, :, :length].copy_(k)
            self.values[layer][slot, :, :length].copy_(v)

    def read_prefix(self, slot: int, length: int) -> KVPrefix:
        return [(keys[slot, :, :length].clone(), values[slot, :, :length].clone())
                for keys, values in zip(self.keys, self.values)]

    # -- one forward call -----------------------------------------------------------------------
    def bind(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        """Arm the cache for one forward call; returns its (B, 1, q, kv) bool attention masks by
        layer type: ``full_attention``, and ``sliding_attention`` with a sliding window."""
        if batch.kv_len > self.max_len:
            raise ValueError(f"context of {batch.kv_len} positions exceeds the slot length {self.max_len}")
        offsets = torch.arange(batch.q_len)[None, :]
        real = offsets < batch.q_lens[:, None]
        self._write_pos = torch.where(real, batch.starts[:, None] + offsets, self.max_len)
        self._batch = batch
        return self._masks(batch)

    def _masks(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        query_pos = batch.position_ids()[:, :, None]  # (B, q, 1)
        key_pos = torch.arange(batch.kv_len)[None, None, :]  # (1, 1, kv)
        causal = key_pos <= query_pos
        masks = {"full_attention": causal[:, None].to(self.device)}
        if self.sliding_window is not None:
            window = causal & (query_pos - key_pos < self.sliding_window)
            masks["sliding_attention"] = window[:, None].to(self.device)
        return masks

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer: store the new K/V, return each row's whole context."""
        batch = self._batch
        if batch is None:
            raise RuntimeError("SlotKVCache.update called outside bind()")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        kv_len = batch.kv_len
        if batch.slots.shape[0] == 1:  # one row (a prefill, a lone decode): slices, no gather
            slot, start, length = int(batch.slots[0]), int(batch.starts[0]), int(batch.q_lens[0])
            keys[slot, :, start : start + length] = key_states[0, :, :length]
            values[slot, :, start : start + length] = value_states[0, :, :length]
            return keys[slot : slot + 1, :, :kv_len], values[slot : slot + 1, :, :kv_len]
        rows = batch.slots[:, None]
        keys[rows, :, self._write_pos] = key_states.transpose(1, 2)
        values[rows, :, self._write_pos] = value_states.transpose(1, 2)
        return keys[batch.slots, :, :kv_len], values[batch.slots, :, :kv_len]

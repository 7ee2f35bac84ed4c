"""A fixed pool of KV-cache slots for continuous batching with a transformers decoder.

Every slot owns ``max_len`` positions in one preallocated tensor per layer, so admitting,
finishing or aborting a request never reallocates. Which request holds which slot is the ``ar``
scheduler's business (its ``SlotPool``); this class only stores tensors. Rows of one forward call can sit at
different lengths; ``SlotBatch`` carries each row's slot and start position, and the attention
masks (full and sliding-window) are built here from those, so the model never infers positions
from the cache.

The cache object is handed to the model as ``cache=``: transformers only calls ``update``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KVPrefix = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v): [kv_heads, length, head_dim]


@dataclass(frozen=True)
class SlotBatch:
    """One forward call's rows: row b writes ``q_len`` positions from ``starts[b]`` in ``slots[b]``."""

    slots: torch.Tensor  # (B,) long
    starts: torch.Tensor  # (B,) long
    q_len: int

    @property
    def kv_len(self) -> int:
        return int(self.starts.max()) + self.q_len

    def position_ids(self) -> torch.Tensor:
        return self.starts[:, None] + torch.arange(self.q_len)[None, :]


class SlotKVCache:
    """Preallocated per-layer K/V storage ``[slots, kv_heads, max_len, head_dim]`` plus masks."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        max_len: int,
        layer_types: list[str],
        sliding_window: int | None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len
        self.layer_types = layer_types
        self.sliding_window = sliding_window
        self._batch: SlotBatch | None = None

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype_bytes: int = 4) -> int:
        return 2 * num_layers * num_kv_heads * max_len * head_dim * dtype_bytes

    # -- prefixes --------------------------------------------------------------------------
    def copy_prefix(self, slot: int, prefix: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a precomputed prefix (per layer (k, v) of shape [kv_heads, P, head_dim]) at 0..P."""
        for layer, (k, v) in enumerate(prefix):
            length = k.shape[1]
            self.keys[layer][slot, :, :length].copy_(k)
            self.values[layer][slot, :, :length].copy_(v)

    def read_prefix(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (self.keys[i][slot, :, :length].clone(), self.values[i][slot, :, :length].clone())
            for i in range(len(self.keys))
        ]

    # -- one forward call ----------------------------------------------------------------------
    def begin(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        """Arm the cache for one forward call; returns the attention masks by layer type."""
        if batch.kv_len > self.max_len:
            raise ValueError(f"context of {batch.kv_len} tokens exceeds the slot length {self.max_len}")
        self._batch = batch
        return self._masks(batch)

    def _masks(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        query_pos = batch.position_ids()[:, :, None]  # (B, q, 1)
        key_pos = torch.arange(batch.kv_len)[None, None, :]  # (1, 1, kv)
        causal = key_pos <= query_pos
        masks = {"full_attention": causal[:, None]}
        if self.sliding_window is not None:
            masks["sliding_attention"] = (causal & (query_pos - key_pos < self.sliding_window))[:, None]
        return masks

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer: store the new K/V, return the rows' whole context."""
        batch = self._batch
        if batch is None:
            raise RuntimeError("SlotKVCache.update called outside begin()")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if batch.q_len == 1:
            keys[batch.slots, :, batch.starts] = key_states[:, :, 0]
            values[batch.slots, :, batch.starts] = value_states[:, :, 0]
        else:
            for row in range(batch.slots.shape[0]):
                slot, start = int(batch.slots[row]), int(batch.starts[row])
                keys[slot, :, start : start + batch.q_len] = key_states[row]
                values[slot, :, start : start + batch.q_len] = value_states[row]
        kv_len = batch.kv_len
        if batch.slots.shape[0] == 1:  # a view, no copy
            slot = int(batch.slots[0])
            return keys[slot : slot + 1, :, :kv_len], values[slot : slot + 1, :, :kv_len]
        return keys[batch.slots, :, :kv_len], values[batch.slots, :, :kv_len]

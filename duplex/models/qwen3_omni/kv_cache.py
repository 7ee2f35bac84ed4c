"""Per-slot K/V storage handed to a transformers decoder as ``cache=``.

The scheduler decides which request owns which slot; this class only stores tensors. Each slot
has ``max_len`` positions in one preallocated tensor per layer, so admitting or freeing a request
never reallocates. One forward call may mix rows at different lengths and with different numbers
of new tokens: ``SlotBatch`` carries each row's slot, start and count, and builds the attention
mask from them, so positions never come from state stored on a module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SlotBatch:
    """Row b writes ``q_lens[b]`` new positions from ``starts[b]`` into slot ``slots[b]``."""

    slots: torch.Tensor  # (B,) long
    starts: torch.Tensor  # (B,) long
    q_lens: torch.Tensor  # (B,) long

    @staticmethod
    def of(slots: list[int], starts: list[int], q_lens: list[int]) -> "SlotBatch":
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
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

    def attention_mask(self) -> torch.Tensor:
        """(B, 1, q, kv) bool: causal within each row, blind to positions past the row's end."""
        keys = torch.arange(self.kv_len)[None, None, :]
        return (keys <= self.position_ids()[:, :, None])[:, None]


class SlotKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        # One spare column per slot takes the writes of padding queries.
        shape = (num_slots, num_kv_heads, max_len + 1, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len
        self._batch: SlotBatch | None = None
        self._write_pos: torch.Tensor | None = None

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype_bytes: int = 4) -> int:
        return 2 * num_layers * num_kv_heads * (max_len + 1) * head_dim * dtype_bytes

    def bind(self, batch: SlotBatch) -> torch.Tensor:
        """Arm the cache for one forward call; returns that call's attention mask."""
        if batch.kv_len > self.max_len:
            raise ValueError(f"context of {batch.kv_len} positions exceeds the slot length {self.max_len}")
        offsets = torch.arange(batch.q_len)[None, :]
        real = offsets < batch.q_lens[:, None]
        self._write_pos = torch.where(real, batch.starts[:, None] + offsets, self.max_len)
        self._batch = batch
        return batch.attention_mask()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer: store the new K/V, return each row's whole context."""
        batch = self._batch
        if batch is None:
            raise RuntimeError("SlotKVCache.update called outside bind()")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        rows = batch.slots[:, None]
        keys[rows, :, self._write_pos] = key_states.transpose(1, 2)
        values[rows, :, self._write_pos] = value_states.transpose(1, 2)
        kv_len = batch.kv_len
        return keys[batch.slots, :, :kv_len], values[batch.slots, :, :kv_len]

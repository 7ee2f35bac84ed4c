"""The runtime's slot K/V cache with its per-call indices on the device, and a fixed-shape mode.

``SlotKVCache.bind`` builds each call's slot and write-position indices on the host; indexing a
GPU tensor with host indices copies them to the device in every layer (twice: K and V). Here
they are copied once per call. ``bind_static`` serves fixed-shape steps (CUDA graphs): row b
writes its new K/V at ``write[b]`` of slot ``slots[b]`` and reads the whole slot, all device ops
on static tensors, so a graph can capture them.
"""

from __future__ import annotations

import torch

from duplex.runtime.contract import SlotBatch, SlotKVCache


class DeviceSlotKV(SlotKVCache):
    _static: tuple[torch.Tensor, torch.Tensor] | None = None
    _rows: torch.Tensor | None = None
    _write: torch.Tensor | None = None
    _slots: torch.Tensor | None = None

    def bind(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        masks = super().bind(batch)
        if self._write_pos is not None:
            self._slots = batch.slots.to(self.device)
            self._rows = self._slots[:, None]
            self._write = self._write_pos.to(self.device)
        return masks

    def bind_static(self, slots: torch.Tensor, write: torch.Tensor) -> None:
        self._static = (slots, write)

    def unbind_static(self) -> None:
        self._static = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._static is not None:
            slots, write = self._static
            keys[slots[:, None], :, write] = key_states.transpose(1, 2)
            values[slots[:, None], :, write] = value_states.transpose(1, 2)
            return keys[slots], values[slots]
        batch = self._batch
        if batch is None or batch.slots.shape[0] == 1 or self._rows is None:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        keys[self._rows, :, self._write] = key_states.transpose(1, 2)
        values[self._rows, :, self._write] = value_states.transpose(1, 2)
        return keys[self._slots, :, : batch.kv_len], values[self._slots, :, : batch.kv_len]

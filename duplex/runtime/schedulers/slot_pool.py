"""A pool of row slots (KV cache rows, feedback rows): who holds which, freed exactly once.

The ``ar`` scheduler owns the pool and hands its runner slot numbers; the runner's tensors for
those rows live in ``runtime/kv_cache.py`` (``SlotKVCache``), which knows nothing of owners."""

from __future__ import annotations


class SlotError(RuntimeError):
    pass


class SlotPool:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a slot pool needs at least one slot, got {size}")
        self.size = size
        self._free = list(range(size - 1, -1, -1))  # pop() hands out slot 0 first
        self._owner: dict[int, str] = {}

    def allocate(self, owner: str) -> int:
        if not self._free:
            raise SlotError(f"all {self.size} slots are in use")
        slot = self._free.pop()
        self._owner[slot] = owner
        return slot

    def release(self, slot: int, owner: str) -> None:
        if self._owner.get(slot) != owner:
            raise SlotError(f"slot {slot} released by {owner!r} but held by {self._owner.get(slot)!r}")
        del self._owner[slot]
        self._free.append(slot)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return len(self._owner)

"""The thinker's steps as CUDA graphs: decode per batch bucket, prefill per (batch, width) bucket.

One forward of the 48-layer MoE thinker is a few milliseconds of GPU work behind some two
thousand kernel launches; eagerly the launches cost a hundred milliseconds more. Each bucket owns
static inputs (slots, positions, write positions; for prefill the input embeddings, padded to the
bucket's width); the step runs the decoder over the slot cache at full slot length with a causal
mask built from the positions (``slot_kv.DeviceSlotKV``), picks each row's next token greedily
and writes it into ``runner.last_token`` in place (decode embeds its input from there). Padding
rows use the spare slot; padding positions of a real row write into its slot's spare column.
A prefill wider than the widest bucket runs eagerly.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from duplex.models.qwen3_omni.graphs import bucket_of, capturable_experts, capture
from duplex.models.qwen3_omni.loading import cache_kwargs

log = logging.getLogger(__name__)


class _Bucket:
    def __init__(self, size: int, device: str, spare: int) -> None:
        self.size = size
        self.slots = torch.full((size,), spare, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.write = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: torch.Tensor | None = None


class _PrefillBucket:
    def __init__(self, size: int, width: int, hidden: int, dtype: torch.dtype, device: str, spare: int,
                 length: int) -> None:
        self.size, self.width = size, width
        self.embeds = torch.zeros(size, width, hidden, dtype=dtype, device=device)
        self.slots = torch.full((size,), spare, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, width, dtype=torch.long, device=device)
        self.write = torch.full((size, width), length - 1, dtype=torch.long, device=device)
        self.last = torch.zeros(size, dtype=torch.long, device=device)  # each row's last real position
        self.graph: torch.cuda.CUDAGraph | None = None
        self.accept: torch.Tensor | None = None  # (size, width, hidden): the talker's accept_hidden_layer
        self.tokens: torch.Tensor | None = None


PREFILL_WIDTHS = (32, 64)


class ThinkerGraphs:
    def __init__(self, runner, sizes: list[int], capture_now: bool = True,
                 widths: tuple[int, ...] = PREFILL_WIDTHS) -> None:
        self.runner = runner
        self.spare = runner.capacity
        self.length = runner.max_len + 1  # the slot's columns; the last is the spare column
        self.key_positions = torch.arange(self.length, device=runner.device)
        self.buckets = {b: _Bucket(b, runner.device, self.spare) for b in sizes}
        hidden = runner.lm.model.config.hidden_size
        self.prefills = {(b, w): _PrefillBucket(b, w, hidden, runner.dtype, runner.device, self.spare, self.length)
                         for b in sizes for w in widths if w < runner.max_len}
        self.pool = None
        self.error: str | None = None
        start = time.perf_counter()
        if capture_now:
            capturable_experts(runner.lm.model, runner.dtype)
        try:
            for bucket in self.buckets.values() if capture_now else ():
                bucket.graph, bucket.tokens, self.pool = capture(functools.partial(self.step, bucket), runner.device,
                                                                 self.pool)
            for pre in self.prefills.values() if capture_now else ():
                pre.graph, (pre.accept, pre.tokens), self.pool = capture(functools.partial(self.prefill_step, pre),
                                                                         runner.device, self.pool)
        except Exception as exc:  # any capture failure falls back to eager steps
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("thinker: CUDA graph capture failed, eager steps instead: %s", self.error)
            self.buckets, self.prefills = {}, {}
        finally:
            runner.kv.unbind_static()
        self.capture_s = time.perf_counter() - start

    @property
    def sizes(self) -> list[int]:
        return sorted(self.buckets)

    @torch.no_grad()  # captured at build, outside any no_grad: autograd would keep every activation
    def step(self, bucket: _Bucket) -> torch.Tensor:
        runner, model = self.runner, self.runner.lm.model
        runner.kv.bind_static(bucket.slots, bucket.write)
        mask = (self.key_positions[None, :] <= bucket.positions)[:, None, None, :]
        embeds = model.embed_tokens(runner.last_token[bucket.slots])[:, None, :]
        out = model(inputs_embeds=embeds, attention_mask=mask, position_ids=bucket.positions, use_cache=True,
                    **cache_kwargs(model, runner.kv))
        tokens = runner.lm.lm_head(out.last_hidden_state[:, -1]).argmax(-1)
        runner.last_token[bucket.slots] = tokens
        return tokens

    @torch.no_grad()  # captured at build, outside any no_grad: autograd would keep every activation
    def prefill_step(self, bucket: _PrefillBucket) -> tuple[torch.Tensor, torch.Tensor]:
        runner, model = self.runner, self.runner.lm.model
        runner.kv.bind_static(bucket.slots, bucket.write)
        mask = (self.key_positions[None, None, :] <= bucket.positions[:, :, None])[:, None]
        out = model(inputs_embeds=bucket.embeds, attention_mask=mask, position_ids=bucket.positions, use_cache=True,
                    output_hidden_states=True, **cache_kwargs(model, runner.kv))
        last = out.last_hidden_state[torch.arange(bucket.size, device=bucket.last.device), bucket.last]
        tokens = runner.lm.lm_head(last).argmax(-1)
        runner.last_token[bucket.slots] = tokens  # rows that sample nothing yet are overwritten when they do
        return out.hidden_states[runner.accept_layer], tokens

    def fits_prefill(self, rows: int, width: int) -> bool:
        """A prefill of ``rows`` rows, the longest ``width`` positions, replays (rows are split
        over the largest batch bucket)."""
        return any(w >= width for _, w in self.prefills)

    def prefill(self, slots: list[int], starts: list[int], inputs: list[torch.Tensor]) -> list[tuple]:
        """Rows' input embeddings (n_b, hidden) from ``starts`` -> per row (accept-layer hidden
        states (n_b, hidden), its next token)."""
        largest = max(b for b, _ in self.prefills)
        out: list[tuple] = []
        for begin in range(0, len(slots), largest):
            end = begin + largest
            out += self._replay_prefill(slots[begin:end], starts[begin:end], inputs[begin:end])
        return out

    def _replay_prefill(self, slots: list[int], starts: list[int], inputs: list[torch.Tensor]) -> list[tuple]:
        n, width = len(slots), max(x.shape[0] for x in inputs)
        bucket = self.prefills[min((b, w) for b, w in self.prefills if b >= n and w >= width)]
        pad = bucket.size - n
        lengths = torch.tensor([x.shape[0] for x in inputs] + [1] * pad)[:, None]
        offsets = torch.arange(bucket.width)[None, :]
        begin = torch.tensor(starts + [0] * pad)[:, None]
        bucket.slots.copy_(torch.tensor(slots + [self.spare] * pad, dtype=torch.long))
        bucket.positions.copy_(begin + torch.minimum(offsets, lengths - 1))
        bucket.write.copy_(torch.where(offsets < lengths, begin + offsets, self.length - 1))
        bucket.last.copy_(lengths[:, 0] - 1)
        for b, x in enumerate(inputs):
            bucket.embeds[b, : x.shape[0]].copy_(x)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:  # not captured (CPU tests of the static step): the same step, run eagerly
            bucket.accept, bucket.tokens = self.prefill_step(bucket)
            self.runner.kv.unbind_static()
        assert bucket.accept is not None and bucket.tokens is not None  # the graph's outputs, or the eager step's
        tokens = bucket.tokens[:n].tolist()
        return [(bucket.accept[b, : x.shape[0]].clone(), tokens[b]) for b, x in enumerate(inputs)]

    def run(self, rows: list[tuple[int, int]]) -> list[int]:
        """Decode rows (slot, position) -> each row's next token."""
        largest = max(self.buckets)
        tokens: list[int] = []
        for begin in range(0, len(rows), largest):
            tokens += self._replay(rows[begin:begin + largest])
        return tokens

    def _replay(self, rows: list[tuple[int, int]]) -> list[int]:
        n = len(rows)
        bucket = self.buckets[bucket_of(self.buckets, n)]
        pad = bucket.size - n
        bucket.slots.copy_(torch.tensor([s for s, _ in rows] + [self.spare] * pad, dtype=torch.long))
        bucket.positions.copy_(torch.tensor([p for _, p in rows] + [0] * pad, dtype=torch.long)[:, None])
        bucket.write.copy_(torch.tensor([p for _, p in rows] + [self.length - 1] * pad, dtype=torch.long)[:, None])
        if bucket.graph is not None:
            bucket.graph.replay()
        else:  # not captured (CPU tests of the static step): the same step, run eagerly
            bucket.tokens = self.step(bucket)
            self.runner.kv.unbind_static()
        assert bucket.tokens is not None  # the graph's output, or the eager step's
        return bucket.tokens[:n].tolist()

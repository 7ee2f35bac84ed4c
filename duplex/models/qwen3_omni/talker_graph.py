"""The talker's decode step as CUDA graphs, one per batch-size bucket.

A decode step is launch-bound: one talker forward, codebook 0, then the code predictor's 15 small
forwards, hundreds of kernels for a few microseconds of math each. A CUDA graph replays them in
one launch. Graphs need static shapes and addresses, so each bucket B owns static input buffers
(the rows' unprojected text embeddings, slots, positions) and the step reads and writes only
preallocated state: K/V in the slot cache at full slot length with a causal mask built from the
positions (``slot_kv.DeviceSlotKV``), feedback and seen codes written in place into the runner's rows.
Rows past the real batch are padding: they use the spare slot (``capacity``) at position 0 and
write K/V into its spare column, so they never touch a request's state.

A prefill row's talker forward (its length varies) runs eagerly; its codebook 0 + code predictor
tail replays from a second graph per bucket, fed the row's last hidden state. The eager step (the
runner's own code path, dynamic lengths) stays the fallback: on the CPU, and wherever capture
fails (logged, not fatal).
"""

from __future__ import annotations

import logging
import time

import torch

from duplex.models.qwen3_omni.graphs import bucket_of, capturable_experts, capture
from duplex.models.qwen3_omni.loading import cache_kwargs

log = logging.getLogger(__name__)


class _Bucket:
    def __init__(self, size: int, text_width: int, width: int, dtype: torch.dtype, device: str, spare: int) -> None:
        self.size = size
        self.text = torch.zeros(size, text_width, dtype=dtype, device=device)
        self.hidden = torch.zeros(size, width, dtype=dtype, device=device)  # the tail's input
        self.slots = torch.full((size,), spare, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.write = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None  # the whole decode step
        self.code0: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None
        self.tail_graph: torch.cuda.CUDAGraph | None = None  # codebook 0 + code predictor from ``hidden``
        self.tail_code0: torch.Tensor | None = None
        self.tail_residual: torch.Tensor | None = None


class TalkerGraphs:
    """Captures the runner's decode step per bucket at start; ``run`` replays it for a plan's
    decode rows (split over the largest bucket when there are more rows)."""

    def __init__(self, runner, sizes: list[int], capture_now: bool = True) -> None:
        self.runner = runner
        self.spare = runner.capacity
        self.length = runner.max_len + 1  # the slot's columns; the last is the spare column
        self.key_positions = torch.arange(self.length, device=runner.device)
        text_width, width = runner.tcfg.thinker_hidden_size, runner.tcfg.text_config.hidden_size
        self.buckets = {b: _Bucket(b, text_width, width, runner.dtype, runner.device, self.spare) for b in sizes}
        self.pool = None
        self.capture_s = 0.0
        self.error: str | None = None
        start = time.perf_counter()
        if capture_now:
            capturable_experts(runner.talker, runner.dtype)
        try:
            for bucket in self.buckets.values() if capture_now else ():
                self._capture(bucket)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("talker: CUDA graph capture failed, eager steps instead: %s", self.error)
            self.buckets = {}
        finally:
            runner.kv.unbind_static()
        self.capture_s = time.perf_counter() - start

    @property
    def sizes(self) -> list[int]:
        return sorted(self.buckets)

    # -- the step (static shapes) -----------------------------------------------------------------
    @torch.no_grad()  # captured at build, outside any no_grad: autograd would keep every activation
    def step(self, bucket: _Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        """One talker + code predictor step over the bucket's static inputs; the feedback of each
        row is written in place into the runner's feedback rows."""
        runner = self.runner
        runner.kv.bind_static(bucket.slots, bucket.write)
        mask = (self.key_positions[None, :] <= bucket.positions)[:, None, None, :]
        embeds = (runner.feedback[bucket.slots] + runner._project_text(bucket.text))[:, None, :]
        out = runner.talker.model(inputs_embeds=embeds, attention_mask=mask, position_ids=bucket.positions,
                                  use_cache=True, **cache_kwargs(runner.talker.model, runner.kv))
        return runner.step_tail(out.last_hidden_state[:, -1], bucket.slots)

    @torch.no_grad()  # captured at build, outside any no_grad: autograd would keep every activation
    def tail(self, bucket: _Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        return self.runner.step_tail(bucket.hidden, bucket.slots)

    def _capture(self, bucket: _Bucket) -> None:
        device = self.runner.device
        bucket.graph, (bucket.code0, bucket.residual), self.pool = capture(lambda: self.step(bucket), device, self.pool)
        bucket.tail_graph, (bucket.tail_code0, bucket.tail_residual), self.pool = capture(
            lambda: self.tail(bucket), device, self.pool)

    # -- replay -------------------------------------------------------------------------------------
    def run(self, rows: list[tuple[int, int, torch.Tensor]]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Decode rows (slot, position, unprojected text embedding) -> (slots, code0, frames)."""
        largest = max(self.buckets)
        slots, code0, frames = [], [], []
        for begin in range(0, len(rows), largest):
            part = rows[begin:begin + largest]
            c0, fr = self._replay(part)
            slots += [slot for slot, _, _ in part]
            code0.append(c0)
            frames.append(fr)
        return slots, torch.cat(code0), torch.cat(frames)

    def run_tail(self, slots: list[int], hidden: torch.Tensor) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Prefill rows: their last talker hidden states (n, hidden) -> (slots, code0, frames)."""
        largest = max(self.buckets)
        code0, frames = [], []
        for begin in range(0, len(slots), largest):
            c0, fr = self._replay_tail(slots[begin:begin + largest], hidden[begin:begin + largest])
            code0.append(c0)
            frames.append(fr)
        return list(slots), torch.cat(code0), torch.cat(frames)

    def _bucket(self, n: int) -> _Bucket:
        return self.buckets[bucket_of(self.buckets, n)]

    def _replay_tail(self, slots: list[int], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(slots)
        bucket = self._bucket(n)
        bucket.slots.copy_(torch.tensor(slots + [self.spare] * (bucket.size - n), dtype=torch.long))
        bucket.hidden[:n].copy_(hidden)
        if bucket.tail_graph is not None:
            bucket.tail_graph.replay()
        else:  # not captured (CPU tests of the static step): the same step, run eagerly
            bucket.tail_code0, bucket.tail_residual = self.tail(bucket)
        return _frames(bucket.tail_code0, bucket.tail_residual, n)

    def _replay(self, rows: list[tuple[int, int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(rows)
        bucket = self._bucket(n)
        pad = bucket.size - n
        slots = torch.tensor([s for s, _, _ in rows] + [self.spare] * pad, dtype=torch.long)
        positions = torch.tensor([p for _, p, _ in rows] + [0] * pad, dtype=torch.long)[:, None]
        write = torch.tensor([p for _, p, _ in rows] + [self.length - 1] * pad, dtype=torch.long)[:, None]
        bucket.slots.copy_(slots, non_blocking=True)
        bucket.positions.copy_(positions, non_blocking=True)
        bucket.write.copy_(write, non_blocking=True)
        bucket.text[:n].copy_(torch.stack([t for _, _, t in rows]))
        if bucket.graph is not None:
            bucket.graph.replay()
        else:  # not captured (CPU tests of the static step): the same step, run eagerly
            bucket.code0, bucket.residual = self.step(bucket)
            self.runner.kv.unbind_static()
        return _frames(bucket.code0, bucket.residual, n)


def _frames(code0: torch.Tensor | None, residual: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` rows' codebook 0 and their whole frames (16 codes), copied out of a
    bucket's outputs (the graph's, or the eager step's)."""
    assert code0 is not None and residual is not None  # captured at build, or just computed eagerly
    first = code0[:n].clone()
    return first, torch.cat([first[:, None], residual[:n]], dim=1)

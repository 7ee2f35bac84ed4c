"""CUDA graphs for the omni runners' fixed-shape steps: batch buckets, capture, and the one
setting that capture needs from transformers.

A step that launches hundreds of small kernels (the talker + code predictor's frame, the
thinker's decode token) costs far more in launches than in math; a graph replays them in one
launch. Graphs need static shapes and addresses: each runner keeps static input buffers per
batch bucket, pads a batch to the next bucket with rows that touch only a spare slot, and
reads/writes only preallocated state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)
log = logging.getLogger(__name__)


def buckets_for(graphs: list[int] | bool | None, device: str, capacity: int) -> list[int]:
    """Bucket sizes to capture: None = the defaults on a GPU, none on the CPU; False = none."""
    if graphs is False or not str(device).startswith("cuda"):
        return []
    sizes = DEFAULT_BUCKETS if graphs is None or graphs is True else tuple(int(b) for b in graphs)
    kept = sorted({b for b in sizes if b <= capacity} | {min(capacity, max(sizes))})
    return [b for b in kept if b >= 1]


def bucket_of(sizes: list[int] | dict, n: int) -> int:
    return min(b for b in sizes if b >= n)


def capturable_experts(model: Any, dtype: torch.dtype) -> None:
    """transformers' grouped_mm experts run on the GPU in bf16 only; elsewhere it falls back to a
    loop that reads offsets on the host, which no graph can capture. batched_mm (a gather and a
    bmm) captures in any dtype."""
    setter = getattr(model, "set_experts_implementation", None)
    if dtype != torch.bfloat16 and setter is not None:
        try:
            setter("batched_mm")
        except (ValueError, RuntimeError) as exc:  # a model without experts: nothing to change
            log.debug("experts implementation left as is: %s", exc)


@torch.no_grad()  # autograd would keep every activation of the warm-ups and the capture alive
def capture(fn: Callable[[], Any], device: str, pool=None) -> tuple[torch.cuda.CUDAGraph, Any, Any]:
    """Warm ``fn`` up on a side stream, then capture it; returns (graph, its outputs, the pool
    the next capture may share)."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):  # lazy inits and the allocator's first blocks happen outside the capture
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the stage's I/O thread may call CUDA while this thread captures.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = fn()
    return graph, outputs, graph.pool()

"""Stages for the GPU relay tests: a source that makes byte patterns on its GPU and a sink that
checks them on its own. Imported by reference in the stage processes (like the toy family)."""

from __future__ import annotations

import time
from typing import Any

import torch

from duplex.runtime.contract import BuildContext, WorkItem


def pattern(nbytes: int, index: int, device: str, cache: dict) -> torch.Tensor:
    """``nbytes`` bytes, different for each index, the same in every process."""
    base = cache.get((nbytes, device))
    if base is None:
        base = cache[(nbytes, device)] = (torch.arange(nbytes, dtype=torch.int32, device=device) % 251).to(torch.uint8)
    return base + (index % 256)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.current_stream().synchronize()


def build_tensor_source(ctx: BuildContext):
    """Per input: ``options['chunks']`` (default 1) tensors of ``options['nbytes']`` on the
    stage's GPU, each stamped after its bytes are made (the hop starts there)."""
    torch.zeros(1, device=ctx.device)  # CUDA is up before the first request (stats report it)
    cache: dict = {}

    def source(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        out = []
        for item in items:
            nbytes, chunks = int(item.params.options["nbytes"]), int(item.params.options.get("chunks", 1))
            rows = []
            for index in range(chunks):
                x = pattern(nbytes, index, ctx.device, cache)
                synchronize(ctx.device)
                rows.append({"x": x, "index": index, "t0": time.monotonic_ns()})
            out.append(rows)
        return out

    return source


def build_tensor_sink(ctx: BuildContext):
    """Checks each tensor on its GPU against the pattern; reports the hop (until the bytes are
    usable here); ``delay_ms`` stands for compute per item."""
    torch.zeros(1, device=ctx.device)
    delay = float(ctx.args.get("delay_ms", 0)) / 1000
    cache: dict = {}

    def sink(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        out = []
        for item in items:
            x = item.data["x"]
            synchronize(ctx.device)
            arrived = time.monotonic_ns()
            if delay:
                time.sleep(delay)
            intact = bool(str(x.device) == ctx.device
                          and torch.equal(x, pattern(x.numel(), item.data["index"], ctx.device, cache)))
            out.append([{"hop_ns": arrived - item.data["t0"], "intact": intact, "device": str(x.device)}])
        return out

    return sink


BUILDERS = {"gpu.tensor_source": build_tensor_source, "gpu.tensor_sink": build_tensor_sink}

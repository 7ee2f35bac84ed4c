"""Stages on GPUs: is the device there, do the budgets fit its free memory, what does it hold.

The coordinator checks before it spawns any stage (``check_devices``): a stage on a CUDA device
this host lacks, or budgets over a card's free memory, fail the start with the stage and device
named. Free memory is read in a short-lived child process: a CUDA context in the coordinator
would hold device memory for the server's lifetime and is not needed otherwise. A stage process
checks its own device again before it builds anything (``device_problem``), gives its builder a
budget in bytes (``budget_bytes``: a fraction of the card), and reports what torch's allocator
holds on it with its stats (``device_memory``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from duplex.config.graph import ConfigError
from duplex.config.pipeline import PipelineConfig, StageConfig
from duplex.config.placement import check_device_budgets, stage_budget_bytes
from duplex.runtime.messages import DeviceMemory


def device_problem(stage: str, device: str, available: bool, count: int, why: str = "") -> str | None:
    """Why ``stage`` cannot run on ``device`` given what this host has; None when it can."""
    if not device.startswith("cuda"):
        return None
    if not available:
        return f"stage {stage!r} is placed on {device}, but CUDA is not available on this host{why}"
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = "1 CUDA device (cuda:0)" if count == 1 else f"{count} CUDA devices (cuda:0..cuda:{count - 1})"
        return f"stage {stage!r} is placed on {device}, but this host has {have}"
    return None


def cuda_presence() -> tuple[bool, int, str]:
    """(available, device count, why not): without creating a CUDA context."""
    try:
        import torch
    except ImportError:
        return False, 0, " (torch is not installed)"
    if not torch.cuda.is_available():
        build = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device seen"
        return False, 0, f" (torch {torch.__version__}: {build})"
    return True, torch.cuda.device_count(), ""


FreeTotal = Callable[[list[int]], dict[int, tuple[int, int]]]


def check_devices(cfg: PipelineConfig, free_total: FreeTotal | None = None) -> None:
    """Every stage's device exists, and per card the budgets fit its free memory. Raises
    ConfigError. ``free_total(indices)`` reads {index: (free, total)} (default: in a child)."""
    cuda_stages = [s for s in cfg.stages if s.device.startswith("cuda")]
    if not cuda_stages:
        return
    available, count, why = cuda_presence()
    problems = [p for s in cuda_stages if (p := device_problem(s.name, s.device, available, count, why))]
    if problems:
        raise ConfigError("placement: " + "; ".join(problems))
    devices = sorted({s.device for s in cuda_stages})
    memory = (free_total or free_and_total_in_child)([int(d.partition(":")[2]) for d in devices])
    for device in devices:
        free, total = memory[int(device.partition(":")[2])]
        check_device_budgets(cfg, device, free, total)


def free_and_total_in_child(indices: list[int]) -> dict[int, tuple[int, int]]:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(free_and_total, indices).result(timeout=120)


def free_and_total(indices: list[int]) -> dict[int, tuple[int, int]]:
    import torch

    return {i: torch.cuda.mem_get_info(i) for i in indices}


def card_total(device: str) -> int:
    import torch

    return int(torch.cuda.get_device_properties(int(device.partition(":")[2] or 0)).total_memory)


def budget_bytes(cfg: PipelineConfig, stage: StageConfig, total: Callable[[str], int] = card_total) -> int | None:
    """A stage's budget in bytes, for its builder (KV slots are sized from it): a fraction of a GPU
    whose size the config does not declare is a fraction of the card this process sees."""
    nbytes = stage_budget_bytes(cfg, stage)
    if nbytes is None and stage.device.startswith("cuda"):
        return int(float(stage.memory) * total(stage.device))
    return nbytes


def device_memory(device: str) -> DeviceMemory | None:
    """What torch's allocator in this process holds on ``device`` (None off CUDA, or before
    anything here touched CUDA: asking would create a context)."""
    torch = sys.modules.get("torch")
    if not device.startswith("cuda") or torch is None or not torch.cuda.is_initialized():
        return None
    return DeviceMemory(device=device, allocated=torch.cuda.memory_allocated(device),
                        reserved=torch.cuda.memory_reserved(device))

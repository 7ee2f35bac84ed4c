"""Placement check: per device, the stages' memory budgets must fit before anything starts.

From the config alone (``check_placement``): per device the fractions, and bytes where the
device's size is known (cpu, or declared under ``devices``), add up to at most 100%. At start,
per GPU (``check_device_budgets``, given what the card reports): every budget in bytes (fractions
of its total) adds up to at most its free memory."""

from __future__ import annotations

from collections.abc import Mapping

import psutil

from duplex.config.graph import ConfigError
from duplex.config.pipeline import PipelineConfig, StageConfig


def device_memory(cfg: PipelineConfig, device: str) -> int | None:
    """Bytes on a device: declared in `devices`, else physical memory for cpu, else unknown."""
    if device in cfg.devices:
        return cfg.devices[device]
    if device == "cpu":
        return psutil.virtual_memory().total
    return None


def stage_budget_bytes(cfg: PipelineConfig, stage: StageConfig) -> int | None:
    """A stage's budget in bytes; None when it is a fraction of a device of unknown size."""
    if isinstance(stage.memory, float) and stage.memory <= 1.0:
        total = device_memory(cfg, stage.device)
        return None if total is None else int(stage.memory * total)
    return int(stage.memory)


def check_placement(cfg: PipelineConfig) -> None:
    """Refuse budgets that oversubscribe a device, naming the device, stages and shares."""
    by_device: dict[str, list[StageConfig]] = {}
    for stage in cfg.stages:
        by_device.setdefault(stage.device, []).append(stage)
    for device, stages in by_device.items():
        total = device_memory(cfg, device)
        shares = {s.name: _share(s, total, device) for s in stages}
        if sum(shares.values()) > 1.0 + 1e-9:
            listing = ", ".join(f"{name}={share:.0%}" for name, share in shares.items())
            size = f" of {total / 2**30:.1f} GiB" if total else ""
            raise ConfigError(
                f"placement: device {device}{size} is oversubscribed: "
                f"budgets sum to {sum(shares.values()):.0%} ({listing})"
            )
        processes = {s.process_name for s in stages}
        _check_fused_devices(cfg, processes)


def _share(stage: StageConfig, total: int | None, device: str) -> float:
    if isinstance(stage.memory, float) and stage.memory <= 1.0:
        return stage.memory
    if total is None:
        # a GPU's size is read from the card at start (``check_device_budgets``), where bytes
        # budgets are checked against its free memory; here only the fractions can add up
        return 0.0
    return int(stage.memory) / total


def check_device_budgets(cfg: PipelineConfig, device: str, free: int, total: int) -> None:
    """Refuse budgets on a GPU that do not fit its free memory now (``free``/``total``: what the
    card reports before any stage loads), naming the stages and their shares in bytes."""
    stages = [s for s in cfg.stages if s.device == device]
    wanted = {s.name: _bytes_on(s, total) for s in stages}
    if sum(wanted.values()) > free:
        listing = ", ".join(f"{name}={nbytes / 2**30:.1f} GiB" for name, nbytes in wanted.items())
        raise ConfigError(
            f"placement: device {device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB, "
            f"but the budgets of its stages sum to {sum(wanted.values()) / 2**30:.1f} GiB ({listing}); "
            f"lower their memory or free the card"
        )


def _bytes_on(stage: StageConfig, total: int) -> int:
    if isinstance(stage.memory, float) and stage.memory <= 1.0:
        return int(stage.memory * total)
    return int(stage.memory)


def _check_fused_devices(cfg: PipelineConfig, processes: set[str]) -> None:
    groups: Mapping[str, list[StageConfig]] = cfg.processes()
    for process in processes:
        devices = {s.device for s in groups[process]}
        if len(devices) > 1:
            raise ConfigError(
                f"placement: process {process!r} fuses stages on different devices {sorted(devices)}"
            )

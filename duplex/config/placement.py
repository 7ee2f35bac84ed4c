"""Placement check: per device, the stages' memory budgets must fit before anything starts."""

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
        raise ConfigError(
            f"placement: stage {stage.name!r} gives memory in bytes on {device}, whose size is "
            f"unknown; declare it under devices: {{{device}: 80GiB}} or use a fraction"
        )
    return int(stage.memory) / total


def _check_fused_devices(cfg: PipelineConfig, processes: set[str]) -> None:
    groups: Mapping[str, list[StageConfig]] = cfg.processes()
    for process in processes:
        devices = {s.device for s in groups[process]}
        if len(devices) > 1:
            raise ConfigError(
                f"placement: process {process!r} fuses stages on different devices {sorted(devices)}"
            )

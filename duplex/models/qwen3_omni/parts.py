"""Where a stage's part of Qwen3-Omni comes from: a checkpoint directory (``model_dir``), or the
real architecture's shapes with random weights made on the device (``shapes``, see real_size).

The same stage args serve the stage builders and the fused baseline, so both build the same
models the same way: ``model_dir`` | ``shapes`` (+ ``shrink``, ``seed``), ``dtype``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL_DIR = "~/.cache/duplex/omni-tiny"
KINDS = ("encoder", "thinker", "talker", "code2wav")
log = logging.getLogger(__name__)


def dtype_of(args: dict[str, Any]) -> torch.dtype:
    name = str(args.get("dtype", "float32"))
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype {name!r}: use float32, bfloat16 or float16")
    return dtype


def model_dir(args: dict[str, Any], stage: str = "") -> str:
    path = Path(str(args.get("model_dir", DEFAULT_MODEL_DIR))).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"stage {stage}: no checkpoint in {path} "
                                f"(make a tiny one with `duplex model init-tiny {path}`)")
    if path == Path(DEFAULT_MODEL_DIR).expanduser():
        from duplex.models.qwen3_omni.tiny import refresh_if_stale

        refresh_if_stale(path)  # the shared cache may hold a tiny checkpoint an older version wrote
    return str(path)


def is_random(args: dict[str, Any]) -> bool:
    return bool(args.get("shapes"))


def load(kind: str, args: dict[str, Any], device: str, stage: str = ""):
    """(module, Qwen3OmniMoeConfig) of part ``kind`` on ``device`` in the args' dtype."""
    if kind not in KINDS:
        raise ValueError(f"unknown part {kind!r}")
    dtype = dtype_of(args)
    if is_random(args):
        from duplex.models.qwen3_omni.real_size import build_part, real_config

        config = real_config(str(args["shapes"]), args.get("shrink"))
        module, seconds = build_part(kind, config, device, dtype, seed=int(args.get("seed", 0)))
        log.info("%s: %s at %s shapes, random weights on %s in %.1f s", stage or kind, kind, args["shapes"],
                 device, seconds)
        return module, config
    from duplex.models.qwen3_omni import loading

    loader = {"encoder": loading.load_audio_encoder, "thinker": loading.load_thinker,
              "talker": loading.load_talker, "code2wav": loading.load_code2wav}[kind]
    module, config = loader(model_dir(args, stage), device)
    return module.to(dtype).requires_grad_(False), config


def part_args(stage_args: dict[str, Any]) -> dict[str, Any]:
    """The args that say where the weights come from (what the fused baseline copies)."""
    keys = ("model_dir", "shapes", "shrink", "seed", "dtype")
    return {k: stage_args[k] for k in keys if k in stage_args}

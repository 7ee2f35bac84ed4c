"""The tools' commands, registered into the `duplex` command line when the tools are installed."""

from __future__ import annotations

import argparse

from duplex_tools.bench import (
    admission,
    amd,
    barge_in,
    doors,
    load,
    pipeline,
    relay,
    services,
    soak,
    turn,
    turn_taking,
)
from duplex_tools.scenario import cli as scenario


def add_bench(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks that print tables (and --json results)")
    bench = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    relay.add_parser(bench)
    barge_in.add_parser(bench)
    pipeline.add_parser(bench)
    turn.add_parser(bench)
    load.add_parser(bench)
    soak.add_parser(bench)
    doors.add_parser(bench)
    turn_taking.add_parser(bench)
    admission.add_parser(bench)
    amd.add_parser(bench)
    services.add_parser(bench)


def add_scenario(sub: argparse._SubParsersAction) -> None:
    scenario.add_parser(sub)

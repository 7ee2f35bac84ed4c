"""`duplex bench turn`: time to first agent audio after the user stops speaking, split by stage.

Through the pipeline (``turn_pipeline.py``), or with ``--session`` through the session
(``turn_session.py``: its VAD ends the turn; preemptive generation off and on side by side), or
with ``--engine`` the local and the engine thinkers side by side (``turn_engine.py``). Each of
them imports the pipeline's measure, none imports this command line back.
"""

from __future__ import annotations

import argparse
import asyncio

from duplex_tools.bench.turn_pipeline import measure, plot, render
from duplex_tools.report import write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("turn", help="time to first audio after end of user speech, by stage")
    parser.add_argument("--config", default="local", help="pipeline YAML, or a name in configs/")
    parser.add_argument("--turns", type=int, default=10, help="measured turns")
    parser.add_argument("--warmup", type=int, default=1, help="turns run first and not counted")
    parser.add_argument("--hangover-ms", type=int, default=500, help="silence after speech before the turn ends")
    parser.add_argument("--chunk-ms", type=int, default=20, help="audio chunk fed per message")
    parser.add_argument("--same-session", action="store_true", help="all turns in one conversation")
    parser.add_argument("--session", action="store_true",
                        help="measure through the session (VAD, turn end, preemptive generation off vs on)")
    parser.add_argument("--engine", action="store_true",
                        help="the local thinker and the engine thinker side by side in one run (turn_engine.py)")
    parser.add_argument("--llm", metavar="URL", help="with --engine: this engine (default: start vLLM's CPU build)")
    parser.add_argument("--llm-model", metavar="NAME", help="with --llm: the model it serves")
    parser.add_argument("--metrics-cost", action="store_true",
                        help="with --session: the server's metrics off vs on (instead of preemption off vs on)")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.add_argument("--plot", dest="plot_path", help="write a PNG of the per-turn split here")
    parser.set_defaults(func=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.engine:
        from duplex_tools.bench import turn_engine

        both, ok = turn_engine.run(args, overrides)
        write_json(args.json_path, both)
        return 0 if ok else 1
    if args.session:
        from duplex_tools.bench import turn_session

        results = asyncio.run(turn_session.measure(args, overrides))
        print(turn_session.render(results))
        write_json(args.json_path, results)
        return 0 if all(s["turns_with_audio"] == s["turns"] for s in results["summary"].values()) else 1
    results = asyncio.run(measure(args, overrides))
    print(render(results))
    write_json(args.json_path, results)
    if args.plot_path:
        plot(results, args.plot_path)
    return 0 if results["summary"]["turns_with_audio"] == results["summary"]["turns"] else 1

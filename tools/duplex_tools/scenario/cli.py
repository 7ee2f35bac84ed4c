"""`duplex scenario run`: play scripted conversations against a live server, print a table,
write JSON, a Markdown summary and a PNG timeline per scenario; exit 1 if an expectation fails."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools import SCENARIOS_DIR
from duplex_tools.report import write_json
from duplex_tools.scenario.measure import Check, ScenarioResult, measure
from duplex_tools.scenario.model import Scenario, ScenarioError, find_scenarios
from duplex_tools.scenario.recording import Recording
from duplex_tools.scenario.report import render_markdown, render_table, totals
from duplex_tools.scenario.runner import run_scenario
from duplex_tools.scenario.server_stats import ServerStats, StatsError

DEFAULT_SCENARIOS = SCENARIOS_DIR


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("scenario", help="scripted conversations against a live server")
    actions = parser.add_subparsers(dest="scenario", required=True, metavar="ACTION")
    run_parser = actions.add_parser("run", help="run scenarios (files or folders; default: scenarios/)")
    run_parser.add_argument("paths", nargs="*", help="scenario YAML files or folders")
    target = run_parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    target.add_argument("--serve", metavar="CONFIG",
                        help="start `duplex serve --config CONFIG` on loopback for the run")
    run_parser.add_argument("--tag", action="append", default=[], help="only scenarios with this tag (repeatable)")
    run_parser.add_argument("--parallel", type=int, default=1,
                            help="scenarios at once (>1: stages are checked empty once after all of them, "
                                 "not after each)")
    run_parser.add_argument("--ttfb-limit-ms", type=float,
                            help="replace every max_ttfb_ms in the scenarios (slow machines, big models)")
    run_parser.add_argument("--out", default="scenario-results",
                            help="folder for the PNG timelines, recordings (JSON) and summary.md")
    run_parser.add_argument("--json", dest="json_path", help="write the results here")
    run_parser.add_argument("--no-plots", action="store_true")
    run_parser.set_defaults(func=run, takes_overrides=False)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        scenarios = find_scenarios(args.paths or [DEFAULT_SCENARIOS], args.tag)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.ttfb_limit_ms is not None:
        for step in (step for scenario in scenarios for step in scenario.steps):
            if step.expect.max_ttfb_ms is not None:
                step.expect.max_ttfb_ms = args.ttfb_limit_ms
    if args.parallel < 1:
        print("error: --parallel must be at least 1", file=sys.stderr)
        return 2
    if args.serve:
        from duplex_tools.harness import ServerProcess

        with ServerProcess(["--config", args.serve, "--port", "0", "--ice-loopback",
                            "--max-sessions", str(max(4, args.parallel))], ready_timeout=600) as server:
            assert server.url is not None
            return asyncio.run(run_all(scenarios, server.url, args))
    return asyncio.run(run_all(scenarios, args.url, args))


async def run_all(scenarios: list[Scenario], url: str, args: argparse.Namespace) -> int:
    use_loopback_candidates(is_loopback_url(url))
    exclusive = args.parallel == 1
    gate = asyncio.Semaphore(args.parallel)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"running {len(scenarios)} scenario(s) against {url}" + ("" if exclusive else f", {args.parallel} at a time"),
          flush=True)

    async def one(scenario: Scenario) -> tuple[Scenario, Recording]:
        async with gate:
            recording = await run_scenario(scenario, url, exclusive, log=lambda line: print(line, flush=True))
            print(f"  {scenario.name}: ran" + (f" ({recording.error})" if recording.error else ""), flush=True)
            return scenario, recording

    # Judged and drawn after every call has ended, so plotting never competes with live audio.
    results = [_judge(scenario, recording, exclusive, out, args.no_plots)
               for scenario, recording in await asyncio.gather(*(one(s) for s in scenarios))]
    run_checks = [] if exclusive else [await _idle_after_all(url)]
    command = "duplex " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "duplex scenario run"
    print(render_table(results))
    for check in run_checks:
        print(f"{check.name}: {'ok' if check.ok else 'FAILED'} {check.detail}")
    (out / "summary.md").write_text(render_markdown(results, url, command))
    print(f"wrote {out / 'summary.md'}" + ("" if args.no_plots else f" and {len(results)} PNG timelines in {out}/"))
    write_json(args.json_path, {"url": url, "command": command, "totals": totals(results),
                                "run_checks": [c.__dict__ for c in run_checks],
                                "scenarios": [r.to_json() for r in results]})
    ok = all(r.ok for r in results) and all(c.ok for c in run_checks)
    return 0 if ok else 1


def _judge(scenario: Scenario, recording: Recording, exclusive: bool, out: Path, no_plots: bool) -> ScenarioResult:
    result = measure(scenario, recording, exclusive)
    (out / f"{scenario.name}.json").write_text(json.dumps(recording.to_json()))
    if not no_plots:
        from duplex_tools.scenario.plot import (
            plot_timeline,  # matplotlib: only when drawing
        )

        result.plot = plot_timeline(recording, result, out / f"{scenario.name}.png")
    print(f"  {scenario.name}: {result.status}" + "".join(f"\n    - {f}" for f in result.failures), flush=True)
    return result


async def _idle_after_all(url: str) -> Check:
    stats = ServerStats(url)
    try:
        await stats.wait_idle(timeout=10.0, no_sessions=True)
        return Check("idle_after_all", True, "every stage empty, no call live")
    except StatsError as exc:
        return Check("idle_after_all", False, str(exc))
    finally:
        await stats.close()


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

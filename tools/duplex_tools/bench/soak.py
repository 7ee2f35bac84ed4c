"""`duplex bench soak`: barge-in after barge-in over concurrent calls until a target count, while
the server's processes are sampled every few seconds (see soak_sample.py): nothing may grow past
warm-up (see soak_verdict.py for the rules). Each caller makes call after call of the soak
scenario (ask, then cut four answers in a row); a barge-in counts when the client saw the
server cancel the reply it was playing for the caller's speech, not when it was attempted.

Warm-up: calls until the first ``--warmup`` barge-ins (10 % of the target), then every caller
hangs up and the server is let go idle; that idle sample is what the rest is compared with.
Then calls until the target, every caller hangs up again, and the final idle sample is taken.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools import SCENARIOS_DIR
from duplex_tools.bench import overrides_refused
from duplex_tools.bench.load import leftover, spread
from duplex_tools.bench.soak_sample import Sample, ServerSampler
from duplex_tools.bench.soak_verdict import Bounds, passed, resource_rows, rss_slope_kib
from duplex_tools.report import table, write_json
from duplex_tools.scenario.cli import is_loopback_url
from duplex_tools.scenario.measure import measure
from duplex_tools.scenario.model import Scenario, ScenarioError, load_scenario
from duplex_tools.scenario.recording import Recording
from duplex_tools.scenario.runner import run_scenario

DEFAULT_CALLER = SCENARIOS_DIR / "load" / "soak-caller.yaml"
SETTLE_POLL_S = 0.5  # at idle, sample this often until fds, threads and segments stop changing ...
SETTLE_TIMEOUT_S = 15.0  # ... for at most this long


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("soak", help="many barge-ins over concurrent calls: the server's RSS, fds, threads, "
                                         "shm segments and stage slots must not grow past warm-up")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server on this host (with --max-sessions >= --sessions)")
    target.add_argument("--serve", metavar="CONFIG",
                        help="start `duplex serve --config CONFIG` on loopback for the run")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent callers")
    parser.add_argument("--barge-ins", type=int, default=1000, help="stop once this many barge-ins were made")
    parser.add_argument("--warmup", type=int, help="barge-ins of warm-up (default: 10%% of --barge-ins)")
    parser.add_argument("--scenario", default=str(DEFAULT_CALLER), help="what each call does (a scenario YAML)")
    parser.add_argument("--sample-s", type=float, default=3.0, help="seconds between samples")
    parser.add_argument("--stagger-s", type=float, default=1.0, help="callers start spread over this many seconds")
    parser.add_argument("--rss-growth-mib", type=float, default=Bounds.rss_mib,
                        help="RSS may grow past warm-up by this many MiB ...")
    parser.add_argument("--rss-growth-pct", type=float, default=Bounds.rss_pct, help="... or this %% of it")
    parser.add_argument("--json", dest="json_path", help="write results (and every sample) here")
    parser.add_argument("--plot", default="bench-soak.png", help="PNG of the resources over barge-ins ('' to skip)")
    # with --serve, arguments after the options go to `duplex serve` (overrides, --media-workers N)
    parser.set_defaults(func=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        caller = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.sessions < 1 or args.barge_ins < 1 or args.sample_s <= 0:
        print("error: --sessions, --barge-ins and --sample-s must be positive", file=sys.stderr)
        return 2
    if overrides_refused(overrides, args.serve):
        return 2
    if args.serve:
        from duplex_tools.harness import ServerProcess

        with ServerProcess(["--config", args.serve, "--port", "0", "--ice-loopback",
                            "--max-sessions", str(args.sessions), *overrides], ready_timeout=600) as server:
            assert server.url is not None
            return asyncio.run(soak(server.url, caller, args))
    return asyncio.run(soak(args.url, caller, args))


@dataclass
class Tally:
    """The finished calls, summed up (the recordings themselves are not kept)."""

    barge_ins: int = 0
    server_barge_ins: int = 0  # the sessions' own counters, for comparison
    calls: int = 0
    failed: int = 0
    false_interruptions: int = 0
    barren_streak: int = 0  # calls in a row that made no barge-in
    stop_ms: list[float] = field(default_factory=list)
    errors: set[str] = field(default_factory=set)

    def add(self, scenario: Scenario, recording: Recording) -> None:
        result = measure(scenario, recording, exclusive=False)
        self.calls += 1
        self.failed += not result.passed
        self.barge_ins += len(result.stop_ms)
        self.server_barge_ins += int((recording.session_stats or {}).get("barge_ins", 0))
        self.false_interruptions += result.false_interruptions
        self.stop_ms += result.stop_ms
        self.barren_streak = 0 if result.stop_ms else self.barren_streak + 1
        if not result.passed:
            self.errors.add((recording.error or "; ".join(result.failures))[:160])


async def soak(url: str, caller: Scenario, args: argparse.Namespace) -> int:
    use_loopback_candidates(is_loopback_url(url))
    sampler = await ServerSampler.find(url) if is_loopback_url(url) else None
    if sampler is None:
        print(f"error: found no server processes of {url} on this host (its /duplex/stats?detail=1 names them)",
              file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else max(1, args.barge_ins // 10)
    tally, samples = Tally(), []
    started = time.monotonic()
    try:
        samples.append(await sampler.take("before", 0, 0))
        print(f"soak: {args.sessions} caller(s), warm-up {warmup} barge-ins, then up to {args.barge_ins}; "
              f"sampling every {args.sample_s:g} s", flush=True)
        stuck = await calls_until(url, caller, args, warmup, tally, sampler, samples, "warm-up")
        left = {"warm-up": await settle(url, sampler, tally, samples, "warmed")}
        if not stuck:
            stuck = await calls_until(url, caller, args, args.barge_ins, tally, sampler, samples, "run")
        left["final"] = await settle(url, sampler, tally, samples, "final")
    finally:
        await sampler.close()
    report = build_report(url, caller, args, warmup, tally, samples, left, stuck, time.monotonic() - started)
    print(render(report))
    if args.plot:
        from duplex_tools.bench.soak_plot import plot_soak  # matplotlib: only when drawing

        plot_soak(samples, warmup, args.plot, title=f"duplex bench soak ({args.sessions} callers, "
                                                    f"{tally.barge_ins} barge-ins) against {url}")
        print(f"wrote {args.plot}")
    write_json(args.json_path, report)
    return 0 if report["passed"] else 1


async def calls_until(url: str, caller: Scenario, args: argparse.Namespace, until: int, tally: Tally,
                      sampler: ServerSampler, samples: list[Sample], phase: str) -> bool:
    """Every caller makes call after call until ``until`` barge-ins were made, while the server
    is sampled. True when it gave up: calls kept making no barge-in at all."""
    give_up = max(5, 3 * args.sessions)
    stuck = False

    async def one_caller(index: int) -> None:
        nonlocal stuck
        await asyncio.sleep(random.Random(index).uniform(0, args.stagger_s))
        while tally.barge_ins < until and not stuck:
            tally.add(caller, await run_scenario(caller, url, exclusive=False))
            stuck = tally.barren_streak >= give_up

    async def sample_every() -> None:
        while True:
            await asyncio.sleep(args.sample_s)  # the sampling period, not a wait for anything
            sample = await sampler.take(phase, tally.barge_ins, tally.calls)
            samples.append(sample)
            print(f"  {phase}: {sample.barge_ins}/{args.barge_ins} barge-ins, {tally.calls} calls "
                  f"({tally.failed} failed), {sample.live_calls} live; RSS {sample.rss_mib:.0f} MiB, "
                  f"{sample.fds} fds, {sample.threads} threads, {sample.shm_segments} shm, "
                  f"held {sum(sample.held.values())}", flush=True)

    sampling = asyncio.create_task(sample_every())
    try:
        await asyncio.gather(*(one_caller(i) for i in range(args.sessions)))
    finally:
        sampling.cancel()
    if stuck:
        print(f"  giving up: {give_up} calls in a row made no barge-in ({sorted(tally.errors)[:3]})", flush=True)
    return stuck


async def settle(url: str, sampler: ServerSampler, tally: Tally, samples: list[Sample], phase: str) -> dict:
    """Once no call is live and no stage holds anything, sample until fds, threads and segments
    read the same twice in a row (closing sockets and joining threads lag the hang-up)."""
    left = await leftover(url)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = await sampler.take(phase, tally.barge_ins, tally.calls)
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_POLL_S)
        sample = await sampler.take(phase, tally.barge_ins, tally.calls)
        steady = (sample.fds, sample.threads, sample.shm_segments) == (last.fds, last.threads, last.shm_segments)
        last = sample
        if steady:
            break
    samples.append(last)
    print(f"  {phase} (idle): RSS {last.rss_mib:.0f} MiB, {last.fds} fds, {last.threads} threads, "
          f"{last.shm_segments} shm, held {sum(last.held.values())}" + (f"; left behind: {left}" if left else ""),
          flush=True)
    return left


def build_report(url: str, caller: Scenario, args: argparse.Namespace, warmup: int, tally: Tally,
                 samples: list[Sample], left: dict, stuck: bool, wall_s: float) -> dict:
    as_json = [s.to_json() for s in samples]
    rows = resource_rows(as_json, Bounds(args.rss_growth_mib, args.rss_growth_pct))
    reached = tally.barge_ins >= args.barge_ins and not stuck
    rows.append({"resource": "barge-ins made", "at_warmup": warmup, "max_after": None, "final": tally.barge_ins,
                 "growth": None, "verdict": "pass" if reached else "FAIL", "rule": f">= {args.barge_ins}"})
    return {
        "url": url, "scenario": caller.name, "sessions": args.sessions, "target_barge_ins": args.barge_ins,
        "warmup_barge_ins": warmup, "barge_ins": tally.barge_ins, "server_barge_ins": tally.server_barge_ins,
        "calls": tally.calls, "calls_failed": tally.failed, "errors": sorted(tally.errors),
        "false_interruptions": tally.false_interruptions, "stop_ms": spread(tally.stop_ms),
        "rss_slope_kib_per_barge_in": rss_slope_kib(as_json), "wall_s": round(wall_s, 1),
        "sample_s": args.sample_s, "left_behind": {k: v for k, v in left.items() if v}, "gave_up": stuck,
        "resources": rows, "passed": passed(rows), "samples": as_json,
    }


def render(report: dict) -> str:
    def cell(value) -> str:
        return "-" if value is None else str(value)

    body = [[r["resource"], cell(r["at_warmup"]), cell(r["max_after"]), cell(r["final"]), cell(r["growth"]),
             r["verdict"], r["rule"]] for r in report["resources"]]
    stop = report["stop_ms"]
    notes = [
        f"{report['barge_ins']} barge-ins (server counted {report['server_barge_ins']}) in {report['calls']} calls "
        f"over {report['sessions']} callers, {report['calls_failed']} calls failed, "
        f"{report['false_interruptions']} false interruptions; {len(report['samples'])} samples in "
        f"{report['wall_s']:.0f} s",
        f"barge-in stop (client) p50 {stop['p50']:.0f} / p95 {stop['p95']:.0f} / p99 {stop['p99']:.0f} / "
        f"max {stop['max']:.0f} ms" if stop["n"] else "no barge-in was timed",
        f"RSS slope after warm-up: {report['rss_slope_kib_per_barge_in']} KiB per barge-in",
        *(f"error: {e}" for e in report["errors"][:5]),
        *(f"left behind ({k}): {v}" for k, v in report["left_behind"].items()),
        "soak: " + ("pass" if report["passed"] else "FAIL"),
    ]
    headers = ["resource", "warmed (idle)", "max after", "final (idle)", "growth", "verdict", "rule"]
    return table(headers, body) + "\n" + "\n".join(notes)

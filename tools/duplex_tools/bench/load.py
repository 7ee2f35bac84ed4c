"""`duplex bench load`: concurrent scripted callers against a live server, at several session
counts. Each caller is a real WebRTC client playing one scenario (default: ask, barge in after a
second of the answer, hear the answer to the interruption out). Per level: TTFB and barge-in stop
time percentiles, calls that failed or were refused, CPU used by the server (edge + stage
processes, when it runs on this host) and by the callers, and agent audio frames lost or late.
A PNG shows the curves and where the knee is.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import shlex
import sys
import time

import psutil

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools import SCENARIOS_DIR
from duplex_tools.bench import overrides_refused
from duplex_tools.bench.knock import knock_until
from duplex_tools.bench.server_parts import mean_parts_ms, read_parts
from duplex_tools.report import percentile, table, write_json
from duplex_tools.scenario.cli import is_loopback_url
from duplex_tools.scenario.frames import frame_quality
from duplex_tools.scenario.measure import measure
from duplex_tools.scenario.model import Scenario, ScenarioError, load_scenario
from duplex_tools.scenario.runner import run_scenario
from duplex_tools.scenario.server_stats import ServerStats, StatsError

DEFAULT_CALLER = SCENARIOS_DIR / "load" / "caller.yaml"
KNEE_TTFB_GROWTH = 1.5  # the knee: p95 TTFB this many times the single-session p95 ...
STOP_BUDGET_MS = 200.0  # ... or barge-in stop p95 over the design budget, or >1% frames late/lost
FRAME_BUDGET = 0.05
KNOCK_AFTER_S = 1.0  # knocks start this long after the last caller's start (its call is up by then)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("load", help="concurrent callers: TTFB, barge-in stop, CPU, late frames vs sessions")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server (start it with --max-sessions >= the largest level)")
    target.add_argument("--serve", metavar="CONFIG",
                        help="start `duplex serve --config CONFIG` on loopback for the run")
    parser.add_argument("--sessions", default="1,2,4,8,16", help="concurrent callers per level, comma separated")
    parser.add_argument("--scenario", default=str(DEFAULT_CALLER), help="what each caller does (a scenario YAML)")
    parser.add_argument("--rounds", type=int, default=1, help="calls per caller per level")
    parser.add_argument("--stagger-s", type=float, default=1.0, help="callers start spread over this many seconds")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="callers run in this many processes (each its own event loop and core): one "
                             "Python process starves past ~16 WebRTC callers and the numbers are then the client's")
    parser.add_argument("--late-ms", type=float, default=60.0, help="a frame this far behind its schedule is late")
    parser.add_argument("--knock-rate", type=float, default=0.0,
                        help="offers per second at the full server while the level's callers are live (one "
                             "level, which --serve makes the server's --max-sessions): the level runs without, "
                             "then with the knocks, side by side; refusals timed, admitted knocks hung up at once")
    parser.add_argument("--versus", metavar="ARGS", default="",
                        help="with --serve: run the levels again against a server started with these arguments "
                             "added (e.g. '--media-workers 2'), and show both side by side")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.add_argument("--plot", default="bench-load.png", help="PNG of the curves ('' to skip)")
    # with --serve, dotted overrides after the options change the served pipeline
    # (`--asr.min_window_s 7`): one config, two settings, compared run by run
    parser.set_defaults(func=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        levels = sorted({int(n) for n in args.sessions.split(",") if n.strip()})
        caller = load_scenario(args.scenario)
    except (ValueError, ScenarioError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not levels or levels[0] < 1 or args.client_procs < 1:
        print("error: --sessions needs positive counts, --client-procs at least 1", file=sys.stderr)
        return 2
    if args.knock_rate < 0 or (args.knock_rate and len(levels) != 1):
        print("error: --knock-rate needs a positive rate and one level (--sessions N: the server's capacity)",
              file=sys.stderr)
        return 2
    if overrides_refused(overrides, args.serve) or (args.versus and not args.serve):
        if args.versus and not args.serve:
            print("error: --versus compares two servers this bench starts: it needs --serve", file=sys.stderr)
        return 2
    if not args.serve:
        return report(asyncio.run(measure_levels(args.url, levels, caller, args)), args.url, caller, args)
    from duplex_tools.harness import ServerProcess

    rows: list[dict] = []
    for variant in ["", args.versus] if args.versus else [""]:
        print(f"server: duplex serve --config {args.serve} {' '.join(overrides)} {variant}".rstrip(), flush=True)
        with ServerProcess(["--config", args.serve, "--port", "0", "--ice-loopback", "--max-sessions",
                            str(levels[-1]), *overrides, *shlex.split(variant)], ready_timeout=600) as server:
            assert server.url is not None
            measured = asyncio.run(measure_levels(server.url, levels, caller, args))
            rows += [row | {"variant": variant} for row in measured]
    if args.versus:  # each level's two rows together
        rows.sort(key=lambda r: (r["sessions"], bool(r["variant"])))
    return report(rows, f"duplex serve --config {args.serve}", caller, args)


async def measure_levels(url: str, levels: list[int], caller: Scenario, args: argparse.Namespace) -> list[dict]:
    use_loopback_candidates(is_loopback_url(url))
    rows = []
    runs = [(sessions, 0.0) for sessions in levels] + [(levels[0], args.knock_rate)] * bool(args.knock_rate)
    for sessions, knock_rate in runs:
        knocking = f" with {knock_rate:g} knocks/s" if knock_rate else ""
        print(f"level {sessions} session(s){knocking}: {sessions * args.rounds} call(s) ...", flush=True)
        row = await run_level(url, caller, sessions, args.rounds, args.stagger_s, args.late_ms,
                              client_procs=args.client_procs, scenario_path=args.scenario, knock_rate=knock_rate)
        rows.append(row)
        print(f"  TTFB p50 {_ms(row['ttfb_ms']['p50'])} p95 {_ms(row['ttfb_ms']['p95'])}; "
              f"stop p95 {_ms(row['stop_ms']['p95'])}; failed {row['calls_failed']}/{row['calls']}", flush=True)
        if knock_rate:
            print(f"  {knock_summary(row['knocks'])}", flush=True)
    return rows


def report(rows: list[dict], target: str, caller: Scenario, args: argparse.Namespace) -> int:
    """The table (and the knee, the PNG, the JSON) of every level measured."""
    plain = [r for r in rows if not r.get("variant")]
    knee = None if args.knock_rate else find_knee(plain)
    print(render(rows, knee))
    summary = {"url": target, "scenario": caller.name, "rounds": args.rounds, "versus": args.versus, "levels": rows,
              "knee_sessions": knee,
              "knee_rule": f"last level with p95 TTFB <= {KNEE_TTFB_GROWTH}x the lowest level's, barge-in stop p95 "
                           f"<= {STOP_BUDGET_MS:.0f} ms and <= {FRAME_BUDGET:.0%} of frames late or lost"}
    if args.plot and not args.knock_rate:  # knocks: one level, two runs, nothing to draw a curve of
        from duplex_tools.bench.load_plot import (
            plot_load,  # matplotlib: only when drawing
        )

        plot_load(rows, knee, args.plot, title=f"duplex bench load ({caller.name}) against {target}")
        print(f"wrote {args.plot}")
    write_json(args.json_path, summary)
    return 0 if all(r["calls_ok"] for r in rows) else 1


async def run_level(url: str, caller: Scenario, sessions: int, rounds: int, stagger_s: float, late_ms: float,
                    client_procs: int = 1, scenario_path: str | None = None, knock_rate: float = 0.0) -> dict:
    server = await server_processes(url)
    client = psutil.Process()
    procs = min(client_procs, sessions)
    pool = None
    if procs > 1:
        assert scenario_path is not None, "caller processes load the scenario from its file"
        pool = multiprocessing.get_context("spawn").Pool(procs, initializer=_import_callers)
        await asyncio.to_thread(pool.map, _ready, range(procs), 1)  # their imports are not the level's time
    parts_before = await read_parts(url)
    before = _cpu_seconds(server), _cpu_seconds([client]), time.monotonic(), _machine_busy_seconds()
    worker_cpu = 0.0
    knocks_done = asyncio.Event()
    knocker = asyncio.create_task(_knock_later(url, knock_rate, stagger_s + KNOCK_AFTER_S, knocks_done))
    try:
        if pool is None:
            calls = await _callers(url, caller, list(range(sessions)), rounds, stagger_s, late_ms)
        else:
            shares = [(url, scenario_path, list(range(i, sessions, procs)), rounds, stagger_s, late_ms)
                      for i in range(procs)]
            try:
                results = await asyncio.to_thread(pool.starmap, _caller_share, shares, 1)
            finally:
                pool.terminate()
                pool.join()
            calls = [call for share, _ in results for call in share]
            worker_cpu = sum(cpu for _, cpu in results)
    finally:
        knocks_done.set()
        knocks = await knocker
    wall = time.monotonic() - before[2]
    server_cpu = _cpu_seconds(server) - before[0] if server else None
    client_cpu = _cpu_seconds([client]) - before[1] + worker_cpu
    machine_busy = _machine_busy_seconds() - before[3]
    left = await leftover(url)
    parts = mean_parts_ms(parts_before, await read_parts(url))
    ttfb = [v for c in calls for v in c["result"].ttfb_ms]
    stop = [v for c in calls for v in c["result"].stop_ms]
    heard = sum(c["frames"].heard for c in calls)
    return {
        "sessions": sessions, "calls": len(calls), "calls_ok": sum(c["result"].passed for c in calls),
        "calls_failed": sum(not c["result"].passed for c in calls),
        "errors": sorted({c["error"][:160] for c in calls if c["error"]}),
        "failed_checks": failed_checks(calls),
        "ttfb_ms": spread(ttfb), "stop_ms": spread(stop),
        "false_interruptions": sum(c["result"].false_interruptions for c in calls),
        "calls_dropped": sum(c["dropped"] for c in calls),  # the server had ended the call before our hang-up
        "frames_heard": heard, "frames_lost": sum(c["frames"].lost for c in calls),
        "frames_late": sum(c["frames"].late for c in calls),
        "frames_bad_share": (sum(c["frames"].lost + c["frames"].late for c in calls) / heard) if heard else None,
        "mic_stalls": sum(c["frames"].mic_stalls for c in calls),
        "wall_s": round(wall, 2),
        "server_cpu_cores": None if server_cpu is None else round(server_cpu / wall, 3),
        "server_processes": len(server),  # the edge and its children (stages, media workers, helpers)
        "client_cpu_cores": round(client_cpu / wall, 3), "machine_cores": os.cpu_count(),
        "machine_busy_cores": round(machine_busy / wall, 3),  # everything on the host, other work included
        "left_behind": left,
        "server_parts_ms": parts,  # mean per part of time to first audio, as the server measured it
        "knock_rate": knock_rate, "knocks": knocks,
    }


def failed_checks(calls: list[dict]) -> dict[str, dict]:
    """Which expectations the failed calls missed: per check, how many times, and one example."""
    found: dict[str, list[str]] = {}
    for call in calls:
        for failure in call["result"].failures:
            check, _, detail = failure.partition(": ")
            found.setdefault(check, []).append(detail)
    return {check: {"times": len(details), "example": details[0][:160]} for check, details in sorted(found.items())}


async def _knock_later(url: str, rate: float, after_s: float, done: asyncio.Event) -> dict | None:
    """Knocks from ``after_s`` (the level's callers are in) until ``done``; None without knocks."""
    if not rate:
        return None
    try:
        await asyncio.wait_for(done.wait(), after_s)
        return None  # the callers were done before the knocks were due
    except TimeoutError:
        knocks = await knock_until(url, rate, done)
    return {"rate_per_s": rate, "sent": knocks.sent, "answers": dict(knocks.answers),
            "refused_ms": spread(knocks.refused_ms), "admitted": knocks.admitted,
            "without_retry_after": knocks.without_retry_after, "errors": sorted(set(knocks.errors))}


def knock_summary(knocks: dict | None) -> str:
    if knocks is None:
        return "knocks: none sent (the callers were done first)"
    refused = knocks["refused_ms"]
    return (f"knocks: {knocks['sent']} sent at {knocks['rate_per_s']:g}/s, answers {knocks['answers']}; 503 in "
            f"p50 {_ms(refused['p50'])} / p95 {_ms(refused['p95'])} / max {_ms(refused['max'])}; "
            f"admitted (hung up at once) {knocks['admitted']}; 503 without Retry-After "
            f"{knocks['without_retry_after']}" + (f"; errors {knocks['errors']}" if knocks["errors"] else ""))


async def _callers(url: str, caller: Scenario, indices: list[int], rounds: int, stagger_s: float,
                   late_ms: float) -> list[dict]:
    calls: list[dict] = []

    async def one_caller(index: int) -> None:
        await asyncio.sleep(random.Random(index).uniform(0, stagger_s))
        for _ in range(rounds):
            recording = await run_scenario(caller, url, exclusive=False)
            result = measure(caller, recording, exclusive=False)
            calls.append({"result": result, "frames": frame_quality(recording, late_ms), "error": recording.error,
                          "dropped": recording.hangup_status == 404})

    await asyncio.gather(*(one_caller(i) for i in indices))
    return calls


def _import_callers() -> None:
    """A caller process's start: its imports are done here, before the level's clock starts."""
    import aiortc  # noqa: F401


def _ready(_: int) -> bool:
    return True


def _caller_share(url: str, scenario_path: str, indices: list[int], rounds: int, stagger_s: float,
                  late_ms: float) -> tuple[list[dict], float]:
    """In a caller process: these callers of the level; returns their calls and its CPU seconds."""
    use_loopback_candidates(is_loopback_url(url))
    started = time.process_time()
    calls = asyncio.run(_callers(url, load_scenario(scenario_path), indices, rounds, stagger_s, late_ms))
    return calls, time.process_time() - started


def _ms(value: float, unit: str = " ms") -> str:
    return "-" if value != value else f"{value:.0f}{unit}"  # NaN: no samples at this level


def spread(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values) if values else float("nan")}


def find_knee(rows: list[dict]) -> int | None:
    """The largest session count before the first level that breaks a budget."""
    base = rows[0]["ttfb_ms"]["p95"] if rows else float("nan")
    knee = None
    for row in rows:
        broken = (row["calls_failed"] > 0 or not row["ttfb_ms"]["p95"] <= KNEE_TTFB_GROWTH * base
                  or not row["stop_ms"]["p95"] <= STOP_BUDGET_MS or (row["frames_bad_share"] or 0) > FRAME_BUDGET)
        if broken:
            break
        knee = row["sessions"]
    return knee


def _level_name(row: dict) -> str:
    name = f"{row['sessions']} + knocks" if row.get("knock_rate") else str(row["sessions"])
    return f"{name} ({row['variant']})" if row.get("variant") else name


def render(rows: list[dict], knee: int | None) -> str:
    headers = ["sessions", "calls ok", "dropped", "TTFB p50", "TTFB p95", "TTFB p99", "stop p50", "stop p95",
               "stop p99", "false int.", "frames lost", "frames late", "mic stalls", "server CPU", "client CPU",
               "machine busy"]
    body = [[_level_name(r),
             f"{r['calls_ok']}/{r['calls']}", r["calls_dropped"],
             *(_ms(r["ttfb_ms"][q], "") for q in ("p50", "p95", "p99")),
             *(_ms(r["stop_ms"][q], "") for q in ("p50", "p95", "p99")), r["false_interruptions"],
             r["frames_lost"], r["frames_late"], r["mic_stalls"],
             "-" if r["server_cpu_cores"] is None else f"{r['server_cpu_cores']:.2f} cores",
             f"{r['client_cpu_cores']:.2f} cores", f"{r['machine_busy_cores']:.2f} cores"] for r in rows]
    notes = [f"times in ms at the client; {rows[0]['machine_cores'] if rows else '?'} CPU cores on this machine; "
             "machine busy counts every process on it, ours and others'"]
    notes.append(f"knee: {knee} session(s)" if knee else "knee: below the lowest level")
    for r in rows:
        name = _level_name(r)
        if r.get("knock_rate"):
            notes.append(f"{name}: {knock_summary(r['knocks'])}")
        if r["errors"]:
            notes.append(f"{name}: " + "; ".join(r["errors"]))
        if r.get("failed_checks"):
            notes.append(f"{name}: failed checks: " + "; ".join(
                f"{check} x{seen['times']} (e.g. {seen['example']})" for check, seen in r["failed_checks"].items()))
        if r["left_behind"]:
            notes.append(f"{name}: left behind after all calls ended: {r['left_behind']}")
        if r.get("server_parts_ms"):
            parts = ", ".join(f"{part} {ms:.0f}" for part, ms in r["server_parts_ms"].items())
            notes.append(f"{name}: the server's mean time to first audio by part (ms): {parts}")
    return table(headers, body) + "\n" + "\n".join(notes)


async def server_processes(url: str) -> list[psutil.Process]:
    """The server's edge process and all its children (stage processes, media workers), if
    they run on this host."""
    if not is_loopback_url(url):
        return []
    stats = ServerStats(url)
    try:
        current = await stats.get()
    except (StatsError, OSError):
        return []
    finally:
        await stats.close()
    found: dict[int, psutil.Process] = {}
    for stage in current.get("stages", {}).values():
        try:
            process = psutil.Process(int(stage["pid"]))
            found[process.pid] = process
            parent = process.parent()
            if parent is not None:
                found[parent.pid] = parent
                # its other children: media workers (--media-workers), multiprocessing's helpers
                found.update((child.pid, child) for child in parent.children())
        except (psutil.Error, KeyError, ValueError):
            continue
    return list(found.values())


def _machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


async def leftover(url: str) -> dict:
    stats = ServerStats(url)
    try:
        await stats.wait_idle(timeout=10.0, no_sessions=True)
        return {}
    except StatsError as exc:
        return {"error": str(exc)}
    finally:
        await stats.close()

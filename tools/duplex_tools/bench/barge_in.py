"""`duplex bench barge-in`: how fast the agent falls silent when the caller talks over it.

Starts `duplex serve` (toy-voice by default) on loopback, calls it with an aiortc client, asks a
question (espeak-ng speech), then interrupts each reply once some of it was heard, N times in a
row. Measured at the client: speech onset sent -> end of the last agent audio received. Run side
by side: our receive path (every audio frame released on arrival, both ends) against aiortc's
stock audio jitter buffer (both ends), one server each.

``--compare metrics``: the cost of watching the server instead: metrics on (the per-call
instruments, and ``/metrics`` scraped every 0.5 s as a Prometheus would) against ``--no-metrics``,
our receive path both times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

import httpx

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.probes import ask, barge_in, next_response
from duplex_tools.report import percentile, table, write_json

VARIANTS = {"arrival-order receive (ours)": True, "aiortc stock jitter buffer": False}
# name -> (server flags, scrape /metrics while measuring)
METRICS_VARIANTS = {"metrics on (scraped every 0.5 s)": ([], True),
                    "metrics off (--no-metrics)": (["--no-metrics"], False)}
SCRAPE_S = 0.5


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("barge-in", help="barge-in stop time at a WebRTC client, ours vs stock receive")
    parser.add_argument("--config", default="toy-voice", help="pipeline to serve (default: toy-voice)")
    parser.add_argument("--rounds", type=int, default=10, help="barge-ins per variant")
    parser.add_argument("--compare", choices=("receive", "metrics"), default="receive",
                        help="receive: our receive path vs aiortc's stock one; metrics: metrics on vs off")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


async def measure(url: str, rounds: int, low_latency: bool, progress: bool = True) -> list[dict]:
    question = espeak("Could you tell me what time it is")
    interruption = espeak("Wait, stop")
    client = RealtimeClient(url, low_latency=low_latency)
    await client.connect()
    results = []
    try:
        response_id = (await ask(client, question))["response"]["id"]
        for i in range(rounds):
            result = await barge_in(client, response_id, interruption)
            results.append({"stop_ms": result.stop_ms, "server_ms": result.server_ms,
                             "audio_end_ms": result.audio_end_ms, "status": result.status})
            if progress:
                print(f"  round {i + 1}/{rounds}: stop {result.stop_ms:.0f} ms", file=sys.stderr, flush=True)
            cancelled = next(e for e in client.of_type("response.done") if e["response"]["id"] == response_id)
            response_id = (await next_response(client, after=client.time_of(cancelled)))["response"]["id"]
    finally:
        await client.hang_up()
    return results


async def _scrape(url: str) -> int:
    """GET /metrics every SCRAPE_S until cancelled; returns how many scrapes answered."""
    done = 0
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                done += (await http.get("/metrics")).status_code == 200
                await asyncio.sleep(SCRAPE_S)
    return done


async def _measure_scraped(url: str, rounds: int, scrape: bool) -> list[dict]:
    scraper = asyncio.create_task(_scrape(url)) if scrape else None
    try:
        return await measure(url, rounds, low_latency=True)
    finally:
        if scraper is not None:
            scraper.cancel()
            print(f"  /metrics scraped {await scraper} times", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    use_loopback_candidates(True)
    report: dict = {"config": args.config, "rounds": args.rounds, "compare": args.compare, "variants": {},
                    "json_path": args.json_path}
    base = ["--config", args.config, "--port", "0", "--ice-loopback"]
    if args.compare == "metrics":
        for name, (flags, scrape) in METRICS_VARIANTS.items():
            print(f"{name}: starting the server ...", file=sys.stderr, flush=True)
            with ServerProcess(base + flags) as server:
                assert server.url is not None
                report["variants"][name] = asyncio.run(_measure_scraped(server.url, args.rounds, scrape))
        return _report(report, "server", "metrics off / on (p50)")
    for name, low_latency in VARIANTS.items():
        flags = list(base)
        if not low_latency:
            flags.append("--aiortc-jitter-buffer")
        print(f"{name}: starting the server ...", file=sys.stderr, flush=True)
        with ServerProcess(flags) as server:
            assert server.url is not None
            report["variants"][name] = asyncio.run(measure(server.url, args.rounds, low_latency))
    return _report(report, "receive path", "stock / ours (p50)")


def _report(report: dict, what: str, ratio: str) -> int:
    rows, p50s = [], {}
    for name, results in report["variants"].items():
        stops = [r["stop_ms"] for r in results]
        server = [r["server_ms"] for r in results if r["server_ms"] is not None]
        p50s[name] = percentile(stops, 50)
        rows.append([name, len(stops), p50s[name], percentile(stops, 95), max(stops), percentile(server, 50)])
    print(table([what, "n", "stop p50 ms", "stop p95 ms", "stop max ms", "server onset->flush p50 ms"], rows))
    first, second = (p50s[name] for name in report["variants"])
    print(f"{ratio}: {second / first:.2f}x; budget: p95 <= 200 ms")
    write_json(report.pop("json_path", None), report)
    return 0

"""`duplex bench barge-in`: how fast the agent falls silent when the caller talks over it.

Starts `duplex serve` (toy-voice by default) on loopback, calls it with an aiortc client, asks a
question (espeak-ng speech), then interrupts each reply once some of it was heard, N times in a
row. Measured at the client: speech onset sent -> end of the last agent audio received. Run side
by side: our receive path (every audio frame released on arrival, both ends) against aiortc's
stock audio jitter buffer (both ends), one server each.

``--compare metrics``: the cost of watching the server instead: metrics on (the per-call
instruments, and ``/metrics`` scraped every 0.5 s as a Prometheus would) against ``--no-metrics``,
our receive path both times.

``--compare speech-servers``: the ``local`` pipeline (or ``--config``) with its Whisper and Piper
in process against the same pipeline with ``--asr`` / ``--tts`` on real Wyoming servers
(wyoming-faster-whisper and wyoming-piper on the same model and voice, ``scripts/setup_speech.sh``),
started here on loopback and sharing this machine's cores.
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
from duplex_tools.probes import TooShort, ask, barge_in, next_response
from duplex_tools.report import percentile, table, write_json

VARIANTS = {"arrival-order receive (ours)": True, "aiortc stock jitter buffer": False}
# name -> (server flags, scrape /metrics while measuring)
METRICS_VARIANTS = {"metrics on (scraped every 0.5 s)": ([], True),
                    "metrics off (--no-metrics)": (["--no-metrics"], False)}
SCRAPE_S = 0.5
FRESH_CALL_TRIES = 3  # per round: a model's first reply may end before it can be cut
# a question every pipeline answers at length (the local persona sells bubble tea; toy-voice talks on)
QUESTION = "Could you tell me what toppings you have and what they cost"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("barge-in", help="barge-in stop time at a WebRTC client, ours vs stock receive")
    parser.add_argument("--config", default=None,
                        help="pipeline to serve (default: toy-voice; local with --compare speech-servers)")
    parser.add_argument("--rounds", type=int, default=10, help="barge-ins per variant")
    parser.add_argument("--compare", choices=("receive", "metrics", "speech-servers"), default="receive",
                        help="receive: our receive path vs aiortc's stock one; metrics: metrics on vs off; "
                             "speech-servers: ASR and TTS in process vs on Wyoming servers")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


async def measure(url: str, rounds: int, low_latency: bool, progress: bool = True) -> list[dict]:
    question = espeak(QUESTION)
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


async def measure_fresh_calls(url: str, rounds: int) -> list[dict]:
    """One call per round: ask, cut the first reply, hang up. A real model's reply to being cut
    depends on the conversation so far (it may be a few words), so each round starts from none;
    a first reply too short to cut is asked again on a new call (bounded)."""
    question, interruption = espeak(QUESTION), espeak("Wait, stop")
    results = []
    for i in range(rounds):
        for _ in range(FRESH_CALL_TRIES):
            client = RealtimeClient(url, low_latency=True)
            await client.connect()
            try:
                response_id = (await ask(client, question))["response"]["id"]
                result = await barge_in(client, response_id, interruption)
                break
            except TooShort as short:
                print(f"  round {i + 1}: the reply was too short to cut ({short}); a new call", file=sys.stderr,
                      flush=True)
            finally:
                await client.hang_up()
        else:
            raise RuntimeError(f"{FRESH_CALL_TRIES} first replies in a row were too short to barge into")
        results.append({"stop_ms": result.stop_ms, "server_ms": result.server_ms,
                        "audio_end_ms": result.audio_end_ms, "status": result.status})
        print(f"  round {i + 1}/{rounds}: stop {result.stop_ms:.0f} ms", file=sys.stderr, flush=True)
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
    if args.config is None:
        args.config = "local" if args.compare == "speech-servers" else "toy-voice"
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
    if args.compare == "speech-servers":
        return _speech_servers(args, base, report)
    for name, low_latency in VARIANTS.items():
        flags = list(base)
        if not low_latency:
            flags.append("--aiortc-jitter-buffer")
        print(f"{name}: starting the server ...", file=sys.stderr, flush=True)
        with ServerProcess(flags) as server:
            assert server.url is not None
            report["variants"][name] = asyncio.run(measure(server.url, args.rounds, low_latency))
    return _report(report, "receive path", "stock / ours (p50)")


def _speech_servers(args: argparse.Namespace, base: list[str], report: dict) -> int:
    from duplex.models.local import assets
    from duplex_tools.speech_servers import WyomingServer, speech_available

    missing = speech_available()
    if missing:
        raise SystemExit(missing)
    assets.prepare_all()
    with WyomingServer.whisper(assets.prepare_whisper()) as whisper, WyomingServer.piper() as piper:
        variants = {"speech in process": [], "speech servers (Wyoming)": ["--asr", whisper.url, "--tts", piper.url]}
        for name, flags in variants.items():
            print(f"{name}: starting the server ...", file=sys.stderr, flush=True)
            with ServerProcess(base + flags, ready_timeout=300) as server:
                assert server.url is not None
                report["variants"][name] = asyncio.run(measure_fresh_calls(server.url, args.rounds))
    return _report(report, "speech", "servers / in process (p50)")


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

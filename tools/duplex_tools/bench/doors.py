"""`duplex bench doors`: the same spoken order over the Realtime WebSocket and over WebRTC, on
the same server, time to first agent audio side by side.

Each turn is a fresh call (a first turn: no history to prefill), the doors alternating turn by
turn so load on the machine falls on both alike. Both clients send the order as a live
microphone would, one 20 ms frame per 20 ms, then silence; the server's VAD ends the turn. Times
are the client's: the order's last loud frame leaving the microphone -> first loud agent audio
arriving (WebSocket: ``response.output_audio.delta``; WebRTC: the RTP track). The server's own
measure (``duplex.metrics`` ttfa_ms: end of speech by its VAD -> first frame handed to the door)
is shown beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import numpy as np

from duplex.audio import resample
from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.report import percentile, table, write_json
from duplex_tools.scenario.cli import is_loopback_url

DOORS = ("websocket", "webrtc")
ORDER = "I would like a bubble tea with less ice."
LOUD = 0.01


@dataclass
class DoorTurn:
    door: str
    ttfa_ms: float | None = None  # at the client
    server_ttfa_ms: float | None = None  # the server's own (duplex.metrics)
    error: str = ""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doors", help="time to first audio of one spoken order: WebSocket vs WebRTC")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server (WebRTC needs --ice-loopback on a loopback-only host)")
    target.add_argument("--serve", metavar="CONFIG", help="start `duplex serve --config CONFIG` on loopback")
    parser.add_argument("--turns", type=int, default=5, help="measured turns per door")
    parser.add_argument("--warmup", type=int, default=1, help="turns per door run first and not counted")
    parser.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY"), help="the server's key, if any")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


def order_audio() -> np.ndarray:
    """The order at 48 kHz, trimmed to its speech: Piper's voice when the local family is
    installed (Whisper hears it best), else espeak-ng."""
    try:
        from duplex.models.local.assets import piper_voice_paths
        from duplex.models.local.tts import PiperSynth

        synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
        audio = resample(synth.synthesize(ORDER), synth.sample_rate, 48000)
    except ImportError:
        from duplex_tools.harness import espeak

        audio = espeak(ORDER)
    loud = np.flatnonzero(np.abs(audio) > LOUD)
    return audio[loud[0]:loud[-1] + 1]


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.turns < 1 or args.warmup < 0:
        print("error: --turns must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    if args.serve:
        from duplex_tools.harness import ServerProcess

        extra = ["--api-key", args.api_key] if args.api_key else []
        with ServerProcess(["--config", args.serve, "--port", "0", "--ice-loopback", "--max-sessions", "2", *extra],
                           ready_timeout=600) as server:
            assert server.url is not None
            return asyncio.run(bench(server.url, args))
    return asyncio.run(bench(args.url, args))


async def bench(url: str, args: argparse.Namespace) -> int:
    use_loopback_candidates(is_loopback_url(url))
    order = order_audio()
    speech_s = len(order) / 48000
    turns: list[DoorTurn] = []
    for index in range(args.warmup + args.turns):
        for door in DOORS:
            turn = await (_websocket_turn(url, order, args.api_key) if door == "websocket"
                          else _webrtc_turn(url, order, args.api_key))
            label = "warmup" if index < args.warmup else f"turn {index - args.warmup + 1}/{args.turns}"
            shown = f"{turn.ttfa_ms:.0f} ms" if turn.ttfa_ms is not None else f"no audio {turn.error}"
            print(f"  {label} {door:>9}: client {shown}, server {turn.server_ttfa_ms} ms", flush=True)
            if index >= args.warmup:
                turns.append(turn)
            await _wait_idle(url, args.api_key)
    results: dict[str, Any] = {"url": url, "order": ORDER, "speech_s": round(speech_s, 3), "cpus": os.cpu_count(),
               "load_avg_1m": os.getloadavg()[0], "turns": [asdict(t) for t in turns], "summary": summarize(turns)}
    print(render(results))
    write_json(args.json_path, results)
    return 0 if all(s["turns_with_audio"] == s["turns"] for s in results["summary"].values()) else 1


async def _websocket_turn(url: str, order: np.ndarray, key: str | None) -> DoorTurn:
    from duplex_tools.ws_client import WsCaller

    turn = DoorTurn("websocket")
    try:
        async with WsCaller(url, key or "none") as caller:
            clip = caller.say(np.concatenate([order, np.zeros(48000, np.float32)]), rate=48000)
            response = (await caller.wait("response.created", timeout=60)).response
            deadline = time.monotonic() + 60
            while caller.first_audio_at(response.id) is None and time.monotonic() < deadline:
                await caller.wait("response.output_audio.delta", timeout=60, after=time.monotonic())
            first = caller.first_audio_at(response.id)
            if first is not None and clip.speech_end_sent is not None:
                turn.ttfa_ms = round(1000 * (first - clip.speech_end_sent), 1)
            metrics = await caller.wait("duplex.metrics", timeout=10, response_id=response.id)
            turn.server_ttfa_ms = getattr(metrics, "ttfa_ms", None)
    except (TimeoutError, ConnectionError) as exc:
        turn.error = repr(exc)[:120]
    return turn


async def _webrtc_turn(url: str, order: np.ndarray, key: str | None) -> DoorTurn:
    from duplex_tools.client import RealtimeClient

    turn = DoorTurn("webrtc")
    client = RealtimeClient(url, api_key=key)
    try:
        await client.connect()
        clip = client.mic.play(np.concatenate([order, np.zeros(48000, np.float32)]))
        created = await client.wait_event("response.created", timeout=60)
        started = await client.wait_event("output_audio_buffer.started", timeout=60,
                                          response_id=created["response"]["id"])
        deadline = time.monotonic() + 10
        while not client.loud_frames(client.time_of(started) - 0.2) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        loud = client.loud_frames(client.time_of(started) - 0.2)
        if loud and clip.speech_end_sent is not None:
            turn.ttfa_ms = round(1000 * (loud[0].at - clip.speech_end_sent), 1)
        metrics = [e for e in client.of_type("duplex.metrics")
                   if e.get("response_id") == created["response"]["id"] and e.get("ttfa_ms") is not None]
        turn.server_ttfa_ms = metrics[0]["ttfa_ms"] if metrics else None
    except (TimeoutError, RuntimeError) as exc:
        turn.error = repr(exc)[:120]
    finally:
        await client.hang_up()
    return turn


async def _wait_idle(url: str, key: str | None, timeout: float = 30.0) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http:
        while time.monotonic() < deadline:
            stats = (await http.get("/duplex/stats")).json()
            if stats["sessions"]["live"] == 0 and all(s["live_requests"] == 0 for s in stats["stages"].values()):
                return
            await asyncio.sleep(0.1)


def summarize(turns: list[DoorTurn]) -> dict:
    summary = {}
    for door in DOORS:
        mine = [t for t in turns if t.door == door]
        client = [t.ttfa_ms for t in mine if t.ttfa_ms is not None]
        server = [t.server_ttfa_ms for t in mine if t.server_ttfa_ms is not None]
        summary[door] = {"turns": len(mine), "turns_with_audio": len(client), "p50": percentile(client, 50),
                         "p95": percentile(client, 95), "mean": float(np.mean(client)) if client else float("nan"),
                         "server_p50": percentile(server, 50)}
    return summary


def render(results: dict) -> str:
    rows = [[door, s["p50"], s["p95"], s["mean"], s["server_p50"], f"{s['turns_with_audio']}/{s['turns']}"]
            for door, s in results["summary"].items()]
    text = table(["door", "client p50 ms", "client p95 ms", "client mean ms", "server p50 ms", "turns with audio"],
                 rows)
    return (text + f"\nend of the order's speech (sent) -> first loud agent audio (received); "
                   f"{results['cpus']} cpus, load average {results['load_avg_1m']:.1f}")

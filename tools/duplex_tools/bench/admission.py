"""`duplex bench admission`: can one address keep real callers out with offers that never connect?

Each round, one loopback address (127.0.0.2) posts ``--attack`` WebRTC offers at once and never
answers their ICE; right after, ``--callers`` real callers, each from an address of its own
(127.0.0.3, ...), place a real call (aiortc: offer, ICE, DTLS, ``session.created``). Three servers
are measured one after another, each a fresh ``duplex serve`` (``--limit-loopback``, so the
other loopback addresses count as other callers, and the default rate burst):

* ``no attack``: the callers alone, the time to connect they get on a quiet server;
* ``rule on``: the default admission, a source holds at most a quarter of the sessions in calls
  not yet connected;
* ``rule off``: ``--pending-share 1`` (a source may hold every session before connecting).

A round ends with every call hung up, so each round starts from an empty server. Printed: real
callers admitted (share of attempts), their time to connect (POST to ``session.created``, p50 and
p95), and what the attack's offers got (answered, 429, 503).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.client import RealtimeClient
from duplex_tools.offer import offer_sdp
from duplex_tools.report import percentile, table, write_json

ATTACKER = "127.0.0.2"
MODES = {"no attack": [], "rule on": [], "rule off": ["--pending-share", "1"]}


@dataclass
class ModeResult:
    mode: str
    attempts: int = 0
    admitted: int = 0
    connect_ms: list[float] = field(default_factory=list)
    caller_refusals: Counter[str] = field(default_factory=Counter)
    attack: Counter[str] = field(default_factory=Counter)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("admission", help="real callers admitted while one address floods half-open offers")
    parser.add_argument("--serve", metavar="CONFIG", default="toy-voice", help="the pipeline each server runs")
    parser.add_argument("--sessions", type=int, default=8, help="the servers' --max-sessions")
    parser.add_argument("--attack", type=int, default=16, help="half-open offers posted at once each round")
    parser.add_argument("--callers", type=int, default=4, help="real callers each round, each from its own address")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if min(args.sessions, args.attack, args.callers, args.rounds) < 1 or args.callers > 200:
        print("error: --sessions, --attack, --rounds and --callers (at most 200) must be >= 1", file=sys.stderr)
        return 2
    from duplex_tools.harness import ServerProcess

    use_loopback_candidates(True)
    results = []
    for mode, extra in MODES.items():
        print(f"== {mode}", flush=True)
        with ServerProcess(["--config", args.serve, "--port", "0", "--ice-loopback", "--limit-loopback",
                            "--max-sessions", str(args.sessions), *extra], ready_timeout=600) as server:
            assert server.url is not None
            results.append(asyncio.run(_mode(server.url, mode, args)))
    _report(results, args)
    return 0


async def _mode(url: str, mode: str, args: argparse.Namespace) -> ModeResult:
    result = ModeResult(mode)
    for round_index in range(args.rounds):
        async with _client(url, ATTACKER) as attacker:
            offers = [] if mode == "no attack" else await asyncio.gather(
                *(_half_open(attacker) for _ in range(args.attack)))
            result.attack.update(str(reply.status_code) for reply in offers)
            callers = await asyncio.gather(*(_real_call(url, f"127.0.0.{3 + i}") for i in range(args.callers)))
            for connect_ms, refusal in callers:
                result.attempts += 1
                if connect_ms is not None:
                    result.admitted += 1
                    result.connect_ms.append(connect_ms)
                else:
                    result.caller_refusals[refusal] += 1
            await asyncio.gather(*(attacker.delete(reply.headers["Location"]) for reply in offers
                                   if reply.status_code == 201))
        print(f"  round {round_index + 1}/{args.rounds}: callers admitted {result.admitted}/{result.attempts}, "
              f"attack {dict(result.attack)}", flush=True)
    return result


def _client(url: str, source: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=source))


async def _half_open(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/realtime/calls", content=await offer_sdp(),
                           headers={"Content-Type": "application/sdp"})


async def _real_call(url: str, source: str) -> tuple[float | None, str]:
    """(ms from the offer to ``session.created``, or None with why it was refused)."""
    caller = RealtimeClient(url, local_address=source)
    started = time.monotonic()
    try:
        await caller.connect(timeout=30)
        return 1000 * (time.monotonic() - started), ""
    except RuntimeError as exc:  # refused: "call refused: 503 ..."
        return None, str(exc).split()[2] if str(exc).startswith("call refused") else "error"
    except TimeoutError:
        return None, "timeout"
    finally:
        await caller.hang_up()


def _report(results: list[ModeResult], args: argparse.Namespace) -> None:
    rows = []
    for r in results:
        rows.append([r.mode, f"{r.admitted}/{r.attempts}", 100 * r.admitted / r.attempts,
                     percentile(r.connect_ms, 50), percentile(r.connect_ms, 95),
                     " ".join(f"{k}x{v}" for k, v in sorted(r.caller_refusals.items())) or "-",
                     " ".join(f"{k}x{v}" for k, v in sorted(r.attack.items())) or "-"])
    print(table(["server", "callers admitted", "%", "connect p50 ms", "connect p95 ms", "callers refused",
                 "attack offers got"], rows))
    quiet, on = results[0], results[1]
    ratio = percentile(on.connect_ms, 50) / percentile(quiet.connect_ms, 50) if quiet.connect_ms else float("nan")
    print(f"time to connect, rule on vs no attack (p50): x{ratio:.2f}")
    payload: dict[str, Any] = {"cpus": os.cpu_count(), "sessions": args.sessions, "attack": args.attack,
                               "callers": args.callers, "rounds": args.rounds, "connect_ratio_on_vs_quiet": ratio,
                               "modes": [_as_json(r) for r in results]}
    write_json(args.json_path, payload)


def _as_json(result: ModeResult) -> dict[str, Any]:
    return {"mode": result.mode, "attempts": result.attempts, "admitted": result.admitted,
            "admitted_share": result.admitted / result.attempts, "connect_ms": result.connect_ms,
            "caller_refusals": dict(result.caller_refusals), "attack": dict(result.attack)}

"""Does the server's memory level off? Answers N WebRTC offers (from peers that then go away, as an
attack run's offers do) and then places M short real calls (a spoken question, the whole answer
heard, hang up) against a toy-voice server, sampling RSS (psutil) after each: the server process
and its media worker (where the peer connections live), and once more each time the server is idle
again (its calls dropped or hung up and its memory keeper's collection run after them).

    python scripts/memory_soak.py --offers 30 --calls 10

The first offers and calls load what a server loads once (aiortc, the codecs, the media code
paths); after them each idle sample should come back to the same level. Exit 1 when the last idle
RSS is more than --bound-mib above the idle RSS after the warm-up (the first --warmup of each)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import httpx
import psutil

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.offer import offer_sdp

MIB = 2**20
IDLE_TIMEOUT_S = 30.0  # an idle server: its calls gone and one collection of the memory keeper after them


STAGE_PIDS: set[int] = set()  # the server's children that are stages, not media workers


def rss_mib(pid: int) -> tuple[float, float]:
    """(the server process, its media workers) in MiB: its spawned children that are not stages."""
    server = psutil.Process(pid)
    workers = [p for p in server.children() if p.pid not in STAGE_PIDS and "spawn_main" in " ".join(p.cmdline())]
    return server.memory_info().rss / MIB, sum(p.memory_info().rss for p in workers) / MIB


async def stats(http: httpx.AsyncClient) -> dict:
    return (await http.get("/duplex/stats")).json()


async def idle(http: httpx.AsyncClient, pid: int) -> tuple[float, float]:
    """RSS once no call is live and the memory keeper has collected after the last one ended."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    collections = None
    while time.monotonic() < deadline:
        current = await stats(http)
        live = current["edges"]["webrtc"]["live_calls"] + current["sessions"]["live"]
        runs = current["edges"].get("memory", {}).get("collections", 0)
        if live == 0 and collections is None:
            collections = runs  # the keeper collects within 2 s of the server going idle
        elif live == 0 and collections is not None and runs > collections:
            return rss_mib(pid)
        await asyncio.sleep(0.2)  # polling the server's stats: nothing else tells when it collected
    raise TimeoutError(f"the server did not go idle and collect within {IDLE_TIMEOUT_S} s")


async def offers(url: str, pid: int, count: int) -> list[tuple[float, float]]:
    samples = []
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        for _ in range(count):
            reply = await http.post("/v1/realtime/calls", content=await offer_sdp(),
                                    headers={"Content-Type": "application/sdp"})
            if reply.status_code != 201:
                raise RuntimeError(f"offer refused: {reply.status_code} {reply.text}")
            samples.append(rss_mib(pid))
    return samples


async def calls(url: str, pid: int, count: int) -> list[tuple[float, float]]:
    samples = []
    question = espeak("what is the weather like today")
    for _ in range(count):
        client = RealtimeClient(url)
        try:
            await client.connect()
            client.mic.play(question)
            await client.wait_event("response.done", timeout=30)
            await client.wait_event("output_audio_buffer.stopped", timeout=30)
        finally:
            await client.hang_up()
            await client.close()
        samples.append(rss_mib(pid))
    return samples


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    report: dict[str, list[tuple[float, float]]] = {"start": [rss_mib(pid)], "offers": [], "offers_idle": [],
                                      "calls": [], "calls_idle": []}
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        detail = (await http.get("/duplex/stats?detail=1")).json()  # pids: the host's own tools see them
        STAGE_PIDS.update(stage["pid"] for stage in detail["stages"].values())
        report["start"] = [rss_mib(pid)]
        for kind, run, total in (("offers", offers, args.offers), ("calls", calls, args.calls)):
            for start in range(0, total, args.warmup):
                report[kind] += await run(url, pid, min(args.warmup, total - start))
                report[kind + "_idle"].append(await idle(http, pid))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offers", type=int, default=30, help="offers answered (their peers go away)")
    parser.add_argument("--calls", type=int, default=10, help="short calls placed (connect, hang up)")
    parser.add_argument("--warmup", type=int, default=5, help="offers / calls between idle samples")
    parser.add_argument("--bound-mib", type=float, default=20.0,
                        help="the last idle RSS may be this far above the first idle RSS after warm-up")
    parser.add_argument("--media-workers", type=int, default=1, help="the server's (0: peers in the server)")
    args = parser.parse_args()
    use_loopback_candidates(True)
    server_args = ["--config", "toy-voice", "--port", "0", "--ice-loopback", "--connect-timeout-s", "2",
                   "--max-sessions", str(max(args.warmup, 4) + 2), "--media-workers", str(args.media_workers)]
    with ServerProcess(server_args) as server:
        assert server.url is not None and server.pid is not None
        report = asyncio.run(soak(server.url, server.pid, args))
    growth = 0.0
    for part, index in (("server", 0), ("media worker", 1)):
        print(f"== {part} RSS, MiB")
        for name, values in report.items():
            print(f"{name:12s} " + " ".join(f"{v[index]:.0f}" for v in values))
        for kind in ("offers_idle", "calls_idle"):
            growth = max(growth, report[kind][-1][index] - report[kind][0][index])
    print(f"largest idle growth after warm-up: {growth:+.1f} MiB (bound {args.bound_mib:g})")
    return 0 if growth <= args.bound_mib else 1


if __name__ == "__main__":
    sys.exit(main())

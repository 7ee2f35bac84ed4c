"""`duplex bench relay`: a stage-to-stage hop (control message + shared-memory relay) between two
real stage processes, side by side with a plain in-process copy of the same bytes, and the
control-message round trip."""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from duplex.config import parse_size, pipeline_from_dict
from duplex.models.registry import BUILDERS
from duplex.runtime.contract import TurnRequest
from duplex.runtime.coordinator import Coordinator
from duplex_tools.report import percentile, table, write_json

PIPELINE = {
    "name": "relay-bench",
    "stages": [
        {"name": "source", "builder": "toy.blob_source", "next": ["sink"], "memory": 0.02},
        {"name": "sink", "builder": "toy.blob_sink", "terminal": True, "memory": 0.02},
    ],
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("relay", help="stage hop latency vs memcpy; control round trip")
    parser.add_argument("--sizes", default="4KiB,1MiB,16MiB", help="payload sizes, comma separated")
    parser.add_argument("--iterations", type=int, default=200, help="hops per size")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


def copy_seconds(nbytes: int, repeats: int) -> list[float]:
    """A plain in-process copy of ``nbytes`` into a reused buffer, per repeat."""
    src = np.full(nbytes, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times


async def measure(sizes: list[int], iterations: int, progress: bool = True) -> dict:
    results: dict = {"sizes": [], "control_rtt_ms": {}}
    async with Coordinator(pipeline_from_dict(PIPELINE), BUILDERS) as coordinator:
        for nbytes in sizes:
            hops = []
            for i in range(iterations + 5):
                request = TurnRequest(session_id="relay-bench", options={"nbytes": nbytes})
                handle = coordinator.submit(request, data={"go": True}, eos=True)
                chunks, finished = await handle.collect()
                out = chunks[-1].data
                if finished.status.value != "completed" or not out.intact or out.nbytes != nbytes:
                    raise RuntimeError(f"hop of {nbytes} bytes failed: {finished} {out}")
                if i >= 5:  # the first hops map segments and warm caches
                    hops.append(out.hop_ns / 1e9)
            copies = copy_seconds(nbytes, iterations)
            hop_p50, copy_p50 = percentile(hops, 50), percentile(copies, 50)
            row = {
                "nbytes": nbytes,
                "hop_p50_ms": hop_p50 * 1e3, "hop_p99_ms": percentile(hops, 99) * 1e3,
                "memcpy_p50_ms": copy_p50 * 1e3, "memcpy_p99_ms": percentile(copies, 99) * 1e3,
                "hop_gbps": nbytes / hop_p50 / 1e9, "memcpy_gbps": nbytes / copy_p50 / 1e9,
                "hop_vs_memcpy_bandwidth": copy_p50 / hop_p50,
            }
            results["sizes"].append(row)
            if progress:
                print(f"  {nbytes} bytes: hop p50 {row['hop_p50_ms']:.3f} ms", flush=True)
        rtts = [await coordinator.ping("sink") for _ in range(iterations)]
        results["control_rtt_ms"] = {"p50": percentile(rtts, 50) * 1e3, "p99": percentile(rtts, 99) * 1e3}
    return results


def render(results: dict) -> str:
    rows = [[_size(r["nbytes"]), r["hop_p50_ms"], r["hop_p99_ms"], r["memcpy_p50_ms"], r["memcpy_p99_ms"],
             r["hop_gbps"], r["memcpy_gbps"], f"{r['hop_vs_memcpy_bandwidth']:.0%}"] for r in results["sizes"]]
    text = table(["payload", "hop p50 ms", "hop p99 ms", "memcpy p50 ms", "memcpy p99 ms", "hop GB/s",
                  "memcpy GB/s", "hop/memcpy bw"], rows)
    rtt = results["control_rtt_ms"]
    return text + (f"\ncontrol round trip (coordinator -> stage -> coordinator): p50 {rtt['p50']:.3f} ms, "
                   f"p99 {rtt['p99']:.3f} ms")


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"relay bench: {len(sizes)} sizes x {args.iterations} hops, two stage processes over ipc + shm")
    results = asyncio.run(measure(sizes, args.iterations))
    print(render(results))
    write_json(args.json_path, results)
    return 0

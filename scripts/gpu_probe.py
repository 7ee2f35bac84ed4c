"""What the GPU sandbox allows, as JSON on stdout: CUDA IPC between two processes (through the
relay's own seam, duplex.runtime.cuda_ipc) and CUDA graph capture/replay. Each check runs in child
processes under a timeout and reports ok/error with what it saw; nothing here can hang its caller.

    python scripts/gpu_probe.py [--timeout 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
NBYTES = 16 << 20


def run_child(args: list[str], timeout: float, stdin: str | None = None) -> dict:
    """Run this script as a child with ``args``; its last stdout line is its JSON result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, __file__, *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"ok": False, "error": f"exit code {done.returncode}", "stderr": done.stderr[-2000:]}
    result["seconds"] = round(time.monotonic() - start, 2)
    return result


# -- CUDA IPC: this process exports, a second one opens, copies and checks ------------------------
def ipc_producer(timeout: float) -> dict:
    import torch

    from duplex.runtime.cuda_ipc import TorchCudaIpc

    seam = TorchCudaIpc()
    # a 16 MiB block, then two small ones; where the allocator puts them in one segment, the second
    # is read through the mapping the first opened (small_blocks_share_a_handle says if it did)
    sizes = [NBYTES, 256 << 10, 256 << 10]
    blocks = [(torch.arange(n, dtype=torch.int32, device="cuda:0") % 251).to(torch.uint8) for n in sizes]
    exports = [seam.export(block) for block in blocks]
    refs = [{"device": 0, "handle": e.handle.hex(), "offset": e.offset, "nbytes": n, "event": e.event.hex(),
             "sum": int(b.sum(dtype=torch.int64))} for e, n, b in zip(exports, sizes, blocks)]
    del blocks  # the seam's keeps are their only owners now
    # fresh interprocess events, as every hop brings one: what opening one costs the consumer
    events = [torch.cuda.Event(interprocess=True) for _ in range(20)]
    for event in events:
        event.record()
    job = {"refs": refs, "events": [event.ipc_handle().hex() for event in events]}
    consumer = run_child(["--child", "ipc-consumer"], timeout, json.dumps(job))
    before = torch.cuda.memory_allocated(0)
    while exports:  # no name may keep a block alive past its free
        seam.free(exports.pop().keep)
    freed = before - torch.cuda.memory_allocated(0)
    return {"ok": bool(consumer.get("ok")) and freed >= sum(sizes), "consumer": consumer,
            "export_16mib_ms": export_times(seam),
            "freed_on_free_bytes": freed, "event_sent": bool(refs[0]["event"]),
            "small_blocks_share_a_handle": refs[1]["handle"] == refs[2]["handle"],
            "offsets": [r["offset"] for r in refs]}


def export_times(seam) -> dict:
    """The producer's share of a hop, steady state (the allocator reuses the block): the copy into
    a fresh block, and the export (torch's interprocess event + handle), host time per call."""
    import torch

    source = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda:0")
    copy_ms, export_ms = [], []
    for _ in range(50):
        torch.cuda.synchronize()
        start = time.perf_counter()
        block = torch.empty_like(source).copy_(source)
        middle = time.perf_counter()
        exported = seam.export(block)
        export_ms.append((time.perf_counter() - middle) * 1e3)
        copy_ms.append((middle - start) * 1e3)
        del block
        seam.free(exported.keep)
        del exported
    return {"copy_launch_p50": p50(copy_ms), "export_p50": p50(export_ms), "export_max": round(max(export_ms), 3)}


def p50(values: list[float]) -> float:
    return round(sorted(values)[len(values) // 2], 3)


def ipc_consumer() -> dict:
    import torch

    from duplex.runtime.cuda_ipc import TorchCudaIpc

    job = json.loads(sys.stdin.read())
    refs = job["refs"]
    seam = TorchCudaIpc()
    event_open_ms = []
    for handle in job["events"]:
        start = time.perf_counter()
        torch.cuda.current_stream().wait_event(torch.cuda.Event.from_ipc_handle(0, bytes.fromhex(handle)))
        event_open_ms.append((time.perf_counter() - start) * 1e3)
    open_copy_ms, match = [], []
    for raw in refs:
        ref = SimpleNamespace(**{**raw, "handle": bytes.fromhex(raw["handle"]), "event": bytes.fromhex(raw["event"])})
        start = time.perf_counter()
        out, done = seam.open_copy("producer", ref)
        seam.wait(done)
        open_copy_ms.append(round((time.perf_counter() - start) * 1e3, 3))
        match.append(int(out.sum(dtype=torch.int64)) == raw["sum"])
    repeat_ms = []
    for _ in range(20):  # the mapping is open now: what a hop's open + copy costs
        start = time.perf_counter()
        out, done = seam.open_copy("producer", ref)
        seam.wait(done)
        repeat_ms.append((time.perf_counter() - start) * 1e3)
    seam.close()
    torch.cuda.synchronize()
    return {"ok": all(match), "bytes_match": match, "first_open_copy_ms": open_copy_ms,
            "cached_open_copy_ms_p50": p50(repeat_ms), "fresh_event_open_wait_ms_p50": p50(event_open_ms[1:]),
            "first_event_open_wait_ms": round(event_open_ms[0], 3)}


# -- CUDA graphs: capture a small step, replay it, compare with eager ----------------------------
def graphs() -> dict:
    import torch

    x = torch.randn(64, 256, device="cuda:0")
    w = torch.randn(256, 256, device="cuda:0")
    static_in = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as torch asks before a capture
            torch.relu(static_in @ w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ w)
    new = torch.randn(64, 256, device="cuda:0")
    static_in.copy_(new)
    start = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    replay_ms = (time.perf_counter() - start) * 1e3
    eager = torch.relu(new @ w)
    diff = float((static_out - eager).abs().max())
    return {"ok": diff <= 1e-3, "max_abs_diff": diff, "replay_ms": round(replay_ms, 3)}


def environment() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        info.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                    free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
    return {"ok": True, **info}


CHILDREN = {"ipc-consumer": ipc_consumer, "graphs": graphs, "environment": environment}


def child(name: str, timeout: float) -> None:
    try:
        result = ipc_producer(timeout) if name == "ipc" else CHILDREN[name]()
    except Exception as exc:  # the report says what failed; the caller goes on
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per check")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.timeout / 2)
        return 0
    checks = {"environment": ["--child", "environment"], "cuda_ipc": ["--child", "ipc", "--timeout", str(args.timeout)],
              "cuda_graphs": ["--child", "graphs"]}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(checks)) as pool:  # side by side: each pays for its own torch import
        futures = {name: pool.submit(run_child, argv, args.timeout) for name, argv in checks.items()}
        report = {name: future.result() for name, future in futures.items()}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

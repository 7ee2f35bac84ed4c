"""`duplex bench services`: the same turns through the session with speech in process and with
speech on servers, side by side: ``local`` (Whisper-base and Piper in duplex's stage processes)
against ``local`` with ``--asr`` / ``--tts`` on real Wyoming servers (wyoming-faster-whisper on
the same Whisper-base folder, wyoming-piper on the same voice; ``scripts/setup_speech.sh``)
that the bench starts on loopback. The thinker is the in-process Gemma 3 270M in both.

Per pipeline: end of user speech -> first agent frame (``turn_session``: the session's own VAD
ends the turn; preemptive generation off and on), and CPU seconds per turn of duplex's own process
tree (this process and its stage processes, the speech servers' trees left out) and of the speech
servers. Every process shares this machine's cores (no pinning): the servers' CPU is the price
moved, not removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import psutil

from duplex_tools.report import table, write_json
from duplex_tools.speech_servers import WyomingServer, speech_available


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("services", help="speech in process vs on Wyoming servers, through the session")
    parser.add_argument("--config", default="local", help="the pipeline (its asr and tts are replaced)")
    parser.add_argument("--turns", type=int, default=5, help="measured turns per mode (preemption off, on)")
    parser.add_argument("--warmup", type=int, default=1, help="turns run first and not counted")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=True)


def _tree_cpu(root: psutil.Process, skip: set[int]) -> float:
    """CPU seconds (user + system) of ``root`` and its descendants, but the subtrees in ``skip``."""
    total, todo = 0.0, [root]
    while todo:
        proc = todo.pop()
        if proc.pid in skip:
            continue
        try:
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
            todo += proc.children()
        except psutil.NoSuchProcess:
            pass
    return total


def _servers_cpu(pids: list[int]) -> float:
    return sum(_tree_cpu(psutil.Process(pid), set()) for pid in pids)


async def measure(args: argparse.Namespace, overrides: list[str]) -> dict:
    from duplex.config import load_pipeline
    from duplex.models.local import assets
    from duplex.server.speech_flags import load_with_servers
    from duplex_tools.bench import turn_session

    missing = speech_available()
    if missing:
        raise SystemExit(missing)
    assets.prepare_all()
    me = psutil.Process()
    results: dict = {"cpus": os.cpu_count(), "pipelines": {}}
    with WyomingServer.whisper(assets.prepare_whisper()) as whisper, WyomingServer.piper() as piper:
        servers = [pid for pid in (whisper.pid, piper.pid) if pid is not None]
        pipelines = {"in process": load_pipeline(args.config, overrides),
                     "speech servers": load_with_servers(args.config, overrides, whisper.url, piper.url)}
        for name, pipeline in pipelines.items():
            print(f"== {name}", flush=True)
            own, engines = _tree_cpu(me, set(servers)), _servers_cpu(servers)
            measured = await turn_session.measure(args, overrides, pipeline=pipeline)
            turns = 2 * (args.warmup + args.turns)  # both modes, warmups included: the CPU covers them all
            measured["duplex_cpu_s_per_turn"] = (_tree_cpu(me, set(servers)) - own) / turns
            measured["servers_cpu_s_per_turn"] = (_servers_cpu(servers) - engines) / turns
            results["pipelines"][name] = measured
    return results


def render(results: dict) -> str:
    rows = []
    for name, measured in results["pipelines"].items():
        for mode, summary in measured["summary"].items():
            rows.append([f"{name}, preemption {mode}", summary["p50"], summary["p95"],
                         f"{summary['turns_with_audio']}/{summary['turns']}",
                         measured["duplex_cpu_s_per_turn"], measured["servers_cpu_s_per_turn"]])
    text = table(["end of user speech -> first agent frame", "p50 ms", "p95 ms", "turns with audio",
                  "duplex CPU s/turn", "speech servers CPU s/turn"], rows)
    return text + (f"\n{results['cpus']} cpus shared by duplex and the speech servers (no pinning); CPU per turn "
                   "counts both preemption modes' turns, warmups included")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    results = asyncio.run(measure(args, overrides))
    print(render(results))
    write_json(args.json_path, results)
    ok = all(s["turns_with_audio"] == s["turns"] for p in results["pipelines"].values() for s in p["summary"].values())
    return 0 if ok else 1

"""`duplex bench services`: the same turns through the session with speech in process and with
speech on servers, side by side: ``local`` (Whisper-base and Piper in duplex's stage processes)
against ``local`` with ``--asr`` / ``--tts`` on real Wyoming servers (wyoming-faster-whisper on
the same Whisper-base folder, wyoming-piper on the same voice; ``scripts/setup_speech.sh``)
that the bench starts on loopback. The thinker is the in-process Gemma 3 270M in both.
``--every-model`` adds a third pipeline with the thinker on a server too: the bundled ``services``
pipeline on the same two speech servers and vLLM's CPU build serving the same Gemma folder
(started here, after the first two have run, unless ``--llm URL --llm-model NAME`` names one).
``--callers N`` runs N sessions at once per turn (``--stagger-ms`` apart).

Per pipeline: end of user speech -> first agent frame (``turn_session``: the session's own VAD
ends the turn; preemptive generation off and on), and CPU seconds per turn of duplex's own process
tree (this process and its stage processes, the speech servers' trees left out) and of the speech
servers. Every process shares this machine's cores (no pinning): the servers' CPU is the price
moved, not removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

import psutil

from duplex_tools.report import table, write_json
from duplex_tools.speech_servers import WyomingServer, speech_available


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("services", help="speech in process vs on Wyoming servers, through the session")
    parser.add_argument("--config", default="local", help="the pipeline (its asr and tts are replaced)")
    parser.add_argument("--turns", type=int, default=5, help="measured turns per mode (preemption off, on)")
    parser.add_argument("--warmup", type=int, default=1, help="turns run first and not counted")
    parser.add_argument("--callers", type=int, default=1, help="sessions at once in each turn")
    parser.add_argument("--stagger-ms", type=float, default=250.0, help="between the callers' starts in a turn")
    parser.add_argument("--every-model", action="store_true",
                        help="also the services pipeline: ASR, thinker (vLLM) and TTS all on servers")
    parser.add_argument("--llm", metavar="URL", help="with --every-model: this engine instead of starting vLLM")
    parser.add_argument("--llm-model", metavar="NAME", help="the model --llm serves")
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

    missing = speech_available()
    if missing:
        raise SystemExit(missing)
    if args.every_model and args.llm is None:
        from duplex_tools.vllm import vllm_available

        missing = vllm_available()
        if missing:
            raise SystemExit(missing)
    assets.prepare_all()
    results: dict = {"cpus": os.cpu_count(), "callers": args.callers, "pipelines": {}}
    with contextlib.ExitStack() as stack:
        whisper = stack.enter_context(WyomingServer.whisper(assets.prepare_whisper()))
        piper = stack.enter_context(WyomingServer.piper())
        servers = [pid for pid in (whisper.pid, piper.pid) if pid is not None]
        pipelines = {"in process": lambda: load_pipeline(args.config, overrides),
                     "speech servers": lambda: load_with_servers(args.config, overrides, whisper.url, piper.url)}
        if args.every_model:
            pipelines["every model on servers"] = lambda: _all_on_servers(args, overrides, whisper.url, piper.url,
                                                                           stack, servers)
        for name, pipeline in pipelines.items():
            print(f"== {name}", flush=True)
            results["pipelines"][name] = await _measure_one(args, overrides, pipeline(), servers)
        results["engine"] = {"base_url": args.llm, "model": args.llm_model} if args.every_model else None
    return results


def _all_on_servers(args: argparse.Namespace, overrides: list[str], asr: str, tts: str,
                    stack: contextlib.ExitStack, servers: list[int]):
    """The services pipeline on the speech servers and an engine (vLLM started here unless named)."""
    from duplex.models.local import assets
    from duplex.server.speech_flags import load_with_servers

    if args.llm is None:
        from duplex_tools.vllm import VLLMServer

        print("starting vLLM (CPU build) on the Gemma 3 270M folder ...", flush=True)
        engine = stack.enter_context(VLLMServer(assets.prepare_gemma()))
        args.llm, args.llm_model = engine.base_url, engine.model
        if engine.pid is not None:
            servers.append(engine.pid)
    thinker = ["--thinker.args.base_url", args.llm, "--thinker.args.model", args.llm_model or ""]
    return load_with_servers("services", [*overrides, *thinker], asr, tts)


async def _measure_one(args: argparse.Namespace, overrides: list[str], pipeline, servers: list[int]) -> dict:
    from duplex_tools.bench import turn_session

    me = psutil.Process()
    cpu: dict[str, tuple[float, float]] = {}

    def mark(when: str) -> None:  # the pipeline is up: its start (model loads) and warmups are left out
        cpu[when] = (_tree_cpu(me, set(servers)), _servers_cpu(servers))

    measured = await turn_session.measure(args, overrides, pipeline=pipeline, mark=mark)
    calls = 2 * args.turns * args.callers  # both modes; each session is one call of one turn
    measured["duplex_cpu_s_per_turn"] = (cpu["done"][0] - cpu["measured"][0]) / calls
    measured["servers_cpu_s_per_turn"] = (cpu["done"][1] - cpu["measured"][1]) / calls
    return measured


def render(results: dict) -> str:
    rows = []
    for name, measured in results["pipelines"].items():
        for mode, summary in measured["summary"].items():
            rows.append([f"{name}, preemption {mode}", summary["p50"], summary["p95"],
                         f"{summary['turns_with_audio']}/{summary['turns']}",
                         measured["duplex_cpu_s_per_turn"], measured["servers_cpu_s_per_turn"]])
    text = table(["end of user speech -> first agent frame", "p50 ms", "p95 ms", "turns with audio",
                  "duplex CPU s/turn", "speech servers CPU s/turn"], rows)
    engine = results.get("engine")
    where = f"; thinker engine {engine['base_url']} ({engine['model']})" if engine else ""
    return text + (f"\n{results['callers']} caller(s) at once; {results['cpus']} cpus shared by duplex and the "
                   f"servers (no pinning){where}; CPU per turn (one call each) is counted over the measured "
                   "turns of both modes, with the pipeline up (its start and the warmups left out); the "
                   "servers' trees are not duplex's")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    results = asyncio.run(measure(args, overrides))
    print(render(results))
    write_json(args.json_path, results)
    ok = all(s["turns_with_audio"] == s["turns"] for p in results["pipelines"].values() for s in p["summary"].values())
    return 0 if ok else 1

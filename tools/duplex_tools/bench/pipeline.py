"""`duplex bench pipeline`: the staged qwen3_omni pipeline (one process per stage) against the
fused baseline (the same models in one process, one loop, one request at a time), side by side
in one run, at several concurrencies.

Every turn's user audio arrives in real time (250 ms feeds); all turns of a round end speaking
together. Time to first audio (TTFA) runs from the end of speech to the first audio chunk; the
real-time factor is a turn's time from end of speech to its last audio over the audio's length;
throughput is seconds of audio produced per second of wall time.

Runtime overhead at concurrency 1: the stages trace each step's compute span (``steptrace``), and
``critical_path`` sums the compute on the path of each turn's first audio chunk; the staged TTFA
over that is the overhead (hops, queueing, waking). The same path's compute in the fused loop is
shown beside it, so contention for the cores between parallel stages shows as well. Then abort
trials measure abort -> every stage empty (``aborts``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from duplex.runtime import steptrace
from duplex.runtime.contract import SESSION_RATE, CallerAudio, TurnRequest
from duplex_tools.bench.aborts import measure_aborts
from duplex_tools.bench.critical_path import first_chunk_path
from duplex_tools.report import percentile, table, write_json

FEED_SAMPLES = 4000  # 250 ms at 16 kHz


@dataclass
class TurnTimes:
    """A staged turn's clock readings (``time.monotonic``), for its critical path."""

    rid: str
    end_of_speech: float
    first_audio: float


@dataclass
class _Round:
    """One staged round: per turn its TTFA (s) and RTF, and the round's audio and wall seconds."""

    ttfa: list[float]
    rtf: list[float]
    audio_s: float
    wall_s: float
    turns: list[TurnTimes]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("pipeline", help="staged vs fused qwen3_omni: TTFA, RTF, throughput by concurrency")
    parser.add_argument("--config", default="omni-tiny", help="bundled pipeline name or YAML path")
    parser.add_argument("--model-dir",
                        help="checkpoint for every stage (default: the config's; a tiny one is made if missing)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma separated")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per concurrency level")
    parser.add_argument("--min-turns", type=int, default=1,
                        help="more rounds at a level until it has this many turns (percentiles at low concurrency)")
    parser.add_argument("--device", help="run every stage and the fused baseline here (cpu, cuda:0); "
                                         "default: the config's stage devices")
    parser.add_argument("--warmup", default="1", help="concurrencies of the untimed warm-up rounds (comma separated)")
    parser.add_argument("--audio-seconds", type=float, default=1.5, help="user speech per turn")
    parser.add_argument("--thinker-tokens", type=int, default=12)
    parser.add_argument("--talker-frames", type=int, default=25, help="codec frames per reply (80 ms each)")
    parser.add_argument("--aborts", type=int, default=9, help="abort trials (abort -> every stage empty); 0 to skip")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.add_argument("--plot", default="bench-pipeline.png", help="PNG of the concurrency curves ('' to skip)")
    parser.set_defaults(func=run, takes_overrides=True)


def _pipeline(config_path: str, model_dir: str | None, overrides: list[str], device: str | None = None):
    from duplex.config import pipeline_from_dict
    from duplex.config.loader import resolve_config_path

    raw = yaml.safe_load(resolve_config_path(config_path).read_text())
    stages = raw["stages"]
    model_dir = model_dir or stages[0].get("args", {}).get("model_dir", "~/.cache/duplex/omni-tiny")
    model_dir = str(Path(model_dir).expanduser())
    for stage in stages:
        stage.setdefault("args", {})["model_dir"] = model_dir
        if device:
            stage["device"] = device
    return pipeline_from_dict(raw, overrides), model_dir


def _ensure_model(model_dir: str, stage_args: dict) -> None:
    from duplex.models.qwen3_omni.parts import is_random

    if is_random(stage_args):
        return  # real shapes, random weights made in each stage: no checkpoint
    if not (Path(model_dir) / "config.json").exists():
        from duplex.models.qwen3_omni.tiny import init_tiny

        print(f"no checkpoint in {model_dir}: writing a tiny random-init one", flush=True)
        init_tiny(model_dir)


def _speech(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(SESSION_RATE * seconds))).astype(np.float32)


def _summary(ttfa: list[float], rtf: list[float], audio_s: float, wall_s: float) -> dict:
    return {"ttfa_p50_ms": percentile(ttfa, 50) * 1e3, "ttfa_p95_ms": percentile(ttfa, 95) * 1e3,
            "rtf_p50": percentile(rtf, 50), "throughput_audio_s_per_s": audio_s / wall_s, "turns": len(ttfa)}


def _line(summary: dict) -> str:
    return (f"ttfa p50 {summary['ttfa_p50_ms']:.0f} ms, p95 {summary['ttfa_p95_ms']:.0f} ms, "
            f"{summary['throughput_audio_s_per_s']:.2f} audio s/s ({summary['turns']} turns)")


def _turn_request(args) -> TurnRequest:
    return TurnRequest(session_id="bench-pipeline", max_new_tokens=args.thinker_tokens,
                       options={"talker_max_new_tokens": args.talker_frames + 1})


async def _staged_round(coord, concurrency: int, args, seed: int) -> _Round:
    from duplex.runtime.requests import OutputChunk

    request = _turn_request(args)
    audios = [_speech(args.audio_seconds, seed + i) for i in range(concurrency)]
    handles = [coord.submit(request) for _ in audios]
    feeds = range(0, len(audios[0]), FEED_SAMPLES)
    for start in feeds:
        last = start + FEED_SAMPLES >= len(audios[0])
        for handle, audio in zip(handles, audios):
            coord.feed(handle.request_id, CallerAudio(audio[start:start + FEED_SAMPLES]), eos=last)
        if not last:
            await asyncio.sleep(FEED_SAMPLES / SESSION_RATE)
    end_of_speech = time.monotonic()

    async def follow(handle):
        first = None
        samples = 0
        async for event in handle:
            if isinstance(event, OutputChunk):
                if event.stage == "code2wav" and event.data is not None:
                    first = first or time.monotonic()
                    samples += len(event.data.samples)
            elif event.status.value != "completed":
                raise RuntimeError(f"turn {handle.request_id} ended {event.status.value}: {event.error}")
        if first is None:
            raise RuntimeError(f"turn {handle.request_id} completed without audio")
        return first - end_of_speech, time.monotonic() - end_of_speech, samples / 24000, first

    results = await asyncio.gather(*(follow(h) for h in handles))
    wall = time.monotonic() - end_of_speech
    audio_s = sum(r[2] for r in results)
    turns = [TurnTimes(h.request_id, end_of_speech, r[3]) for h, r in zip(handles, results)]
    return _Round([r[0] for r in results], [r[1] / r[2] for r in results], audio_s, wall, turns)


async def _measure_staged(cfg, levels: list[int], args) -> dict:
    from duplex.models.registry import BUILDERS
    from duplex.runtime.coordinator import Coordinator

    out: dict[int, dict] = {}
    turns_c1: list[TurnTimes] = []
    async with Coordinator(cfg, BUILDERS) as coord:
        for warm in _warmups(args):  # first calls allocate, page in, pick kernels for new shapes
            await _staged_round(coord, warm, args, seed=999)
        for level in levels:
            ttfa, rtf, audio_s, wall = [], [], 0.0, 0.0
            for r in range(_rounds(level, args)):
                done = await _staged_round(coord, level, args, seed=100 * level + r)
                ttfa += done.ttfa
                rtf += done.rtf
                audio_s += done.audio_s
                wall += done.wall_s
                if level == 1:
                    turns_c1 += done.turns
            out[level] = _summary(ttfa, rtf, audio_s, wall)
            await coord.wait_idle(timeout=30)
            print(f"  staged  c={level}: {_line(out[level])}", flush=True)
        aborts = await measure_aborts(coord, args.aborts) if args.aborts else {}
    return {"levels": out, "turns_c1": turns_c1, "aborts": aborts}


def _warmups(args) -> list[int]:
    return [int(c) for c in str(args.warmup).split(",") if c.strip()]


def _rounds(level: int, args) -> int:
    return max(args.rounds, -(-args.min_turns // level))


def _fused_options(cfg, device: str | None) -> dict:
    """The fused baseline builds what the stages build: the same weights' source, dtype, slot
    lengths, reply lengths and talker graphs, on the thinker stage's device."""
    from duplex.models.qwen3_omni.parts import part_args

    thinker, talker = cfg.stage("thinker"), cfg.stage("talker")
    return {"parts": part_args(thinker.args), "device": device or thinker.device,
            "thinker_max_len": int(thinker.args.get("max_len", 1024)),
            "talker_max_len": int(talker.args.get("max_len", 2048)),
            "ignore_eos": bool(thinker.args.get("ignore_eos", False)), "graphs": talker.args.get("graphs")}


def _measure_fused(options: dict, system_ids: list[int], chunking: dict, levels: list[int],
                   args) -> tuple[dict[int, dict], list[dict]]:
    import torch

    from duplex_tools.qwen3_omni.fused import FusedOmni

    torch.set_num_threads(1)
    fused = FusedOmni(options.pop("parts"), system_ids=system_ids, **chunking, **options)
    params = _turn_request(args)
    for _ in range(2):  # warm-up
        fused.run_turn(_speech(args.audio_seconds, 999), params)
    out, paths_c1 = {}, []
    for level in levels:
        ttfa, rtf, audio_s, wall = [], [], 0.0, 0.0
        for r in range(_rounds(level, args)):
            # All turns ended speaking now; one loop serves them one after another.
            start = time.perf_counter()
            for i in range(level):
                turn = fused.run_turn(_speech(args.audio_seconds, 100 * level + r + i), params)
                if level == 1:
                    first_audio = turn.started + turn.first_audio_s
                    paths_c1.append(first_chunk_path(turn.spans, "fused", turn.started, first_audio,
                                                     chunking["first_chunk_frames"]))
                waited = time.perf_counter() - start - turn.total_s
                ttfa.append(waited + turn.first_audio_s)
                rtf.append((waited + turn.total_s) / (turn.audio_samples / 24000))
                audio_s += turn.audio_samples / 24000
            wall += time.perf_counter() - start
        out[level] = _summary(ttfa, rtf, audio_s, wall)
        print(f"  fused   c={level}: {_line(out[level])}", flush=True)
    return out, [p for p in paths_c1 if p]


def _accelerator(cfg) -> str:
    if not any(s.device.startswith("cuda") for s in cfg.stages):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def render(results: dict) -> str:
    rows = []
    for level in results["concurrency"]:
        s, f = results["staged"][str(level)], results["fused"][str(level)]
        rows.append([level, s["ttfa_p50_ms"], s["ttfa_p95_ms"], f["ttfa_p50_ms"], f["ttfa_p95_ms"], s["rtf_p50"],
                     f["rtf_p50"], s["throughput_audio_s_per_s"], f["throughput_audio_s_per_s"],
                     f"{f['ttfa_p95_ms'] / s['ttfa_p95_ms']:.2f}x",
                     f"{s['throughput_audio_s_per_s'] / f['throughput_audio_s_per_s']:.2f}x"])
    text = table(["conc", "staged TTFA p50 ms", "p95", "fused TTFA p50 ms", "p95", "staged RTF", "fused RTF",
                  "staged audio s/s", "fused audio s/s", "p95 TTFA fused/staged", "thru staged/fused"], rows)
    o = results["overhead_c1"]
    if o.get("turns"):
        text += (f"\ncritical path at c=1 (p50 of {o['turns']} turns): pure compute {o['critical_compute_ms']:.1f} ms "
                 f"(serial sum {o['serial_compute_ms']:.1f} ms), staged TTFA {o['staged_ms']:.1f} ms -> runtime "
                 f"overhead {o['ratio']:.1%} (per-turn p50 {o['per_turn_ratio_p50']:.1%}); "
                 f"fused TTFA p50 {o['fused_ms']:.1f} ms"
                 f"\n  the same path computed in the fused loop (no stage competing for the cores): "
                 f"{o['isolated_compute_ms']:.1f} ms -> staged TTFA over it {o['ratio_vs_isolated']:.1%}")
        text += "\n  compute on the path, ms: " + ", ".join(f"{k} {v:.1f}" for k, v in o["compute_ms"].items())
        text += "\n  gaps on the path, ms:    " + ", ".join(f"{k} {v:.1f}" for k, v in o["gaps_ms"].items())
    a = results.get("aborts") or {}
    if a:
        text += (f"\nabort -> every stage empty ({len(a['trials'])} trials): p50 {a['p50_ms']:.1f} ms, "
                 f"p95 {a['p95_ms']:.1f} ms, max {a['max_ms']:.1f} ms (target <= 50 ms)")
    return text


def overhead_c1(spans: list[dict], turns: list[TurnTimes], first_chunk_frames: int, fused_ms: float,
                fused_paths: list[dict]) -> dict:
    """TTFA over the critical path's pure compute, per turn, from the stages' step spans; and the
    same path's compute in the fused loop (no other stage competing for the cores)."""
    paths = [p for t in turns
             if (p := first_chunk_path(spans, t.rid, t.end_of_speech, t.first_audio, first_chunk_frames))]
    if not paths:
        return {"turns": 0, "fused_ms": fused_ms}
    med = lambda values: percentile(values, 50)
    critical, ttfa = med([p["critical_compute_ms"] for p in paths]), med([p["ttfa_ms"] for p in paths])
    isolated = med([p["critical_compute_ms"] for p in fused_paths])
    compute = {"encoder": med([p["compute_ms"]["encoder"] for p in paths]),
               "thinker": med([sum(p["compute_ms"]["thinker"]) for p in paths]),
               "talker": med([sum(p["compute_ms"]["talker"]) for p in paths]),
               "code2wav": med([p["compute_ms"]["code2wav"] for p in paths])}
    return {"turns": len(paths), "critical_compute_ms": critical, "staged_ms": ttfa, "ratio": ttfa / critical - 1,
            "per_turn_ratio_p50": med([p["overhead"] for p in paths]), "fused_ms": fused_ms,
            "isolated_compute_ms": isolated, "ratio_vs_isolated": ttfa / isolated - 1, "fused_paths": fused_paths,
            "serial_compute_ms": med([p["serial_compute_ms"] for p in paths]), "compute_ms": compute,
            "gaps_ms": {k: med([p["gaps_ms"][k] for p in paths]) for k in paths[0]["gaps_ms"]}, "paths": paths}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = results["concurrency"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("staged", "o-"), ("fused", "s--")):
        left.plot(levels, [results[mode][str(c)]["ttfa_p95_ms"] for c in levels], style, label=f"{mode} p95")
        left.plot(levels, [results[mode][str(c)]["ttfa_p50_ms"] for c in levels], style, alpha=0.4, label=f"{mode} p50")
        right.plot(levels, [results[mode][str(c)]["throughput_audio_s_per_s"] for c in levels], style, label=mode)
    left.set(xlabel="concurrent turns", ylabel="time to first audio (ms)", title="TTFA")
    right.set(xlabel="concurrent turns", ylabel="audio seconds per second", title="throughput")
    for axis in (left, right):
        axis.set_xticks(levels)
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(f"duplex bench pipeline: {results['config']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    levels = [int(c) for c in args.concurrency.split(",")]
    cfg, model_dir = _pipeline(args.config, args.model_dir, overrides, args.device)
    _ensure_model(model_dir, cfg.stage("thinker").args)
    system_ids = [int(i) for i in cfg.stage("thinker").args.get("system_ids", [])]
    talker_args = cfg.stage("talker").args
    chunking = {"first_chunk_frames": int(talker_args.get("first_chunk_frames", 2)),
                "chunk_frames": int(talker_args.get("chunk_frames", 6))}
    print(f"pipeline bench: {cfg.name}, concurrency {levels}, {args.audio_seconds}s speech, "
          f"{args.thinker_tokens} tokens, {args.talker_frames} frames per turn; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="duplex-trace-") as trace_dir:
        os.environ[steptrace.ENV] = trace_dir  # the stage processes inherit it at spawn
        try:
            staged = asyncio.run(_measure_staged(cfg, levels, args))
        finally:
            os.environ.pop(steptrace.ENV, None)
        spans = steptrace.read_spans(trace_dir)
    # Written now too, so a fused run that fails or times out leaves the staged figures.
    write_json(args.json_path, {"config": cfg.name, "concurrency": levels, "partial": True,
                                "staged": {str(k): v for k, v in staged["levels"].items()}, "aborts": staged["aborts"]})
    # The stage processes have ended (their device memory with them) before the fused one builds.
    fused, fused_paths = _measure_fused(_fused_options(cfg, args.device), system_ids, chunking, levels, args)
    results = {"config": cfg.name, "concurrency": levels, "args": {k: v for k, v in vars(args).items() if k != "func"},
               "devices": sorted({s.device for s in cfg.stages}), "accelerator": _accelerator(cfg),
               "load_avg_1m": os.getloadavg()[0], "staged": {str(k): v for k, v in staged["levels"].items()},
               "fused": {str(k): v for k, v in fused.items()}, "aborts": staged["aborts"],
               "overhead_c1": overhead_c1(spans, staged["turns_c1"], chunking["first_chunk_frames"],
                                          fused[1]["ttfa_p50_ms"] if 1 in fused else float("nan"), fused_paths)}
    print(render(results))
    write_json(args.json_path, results)
    if args.plot:
        plot(results, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m duplex_tools.bench.pipeline ...``: the same command without ``duplex``'s other
    commands, whose imports (the server, the media stack) a bare GPU machine does not have."""
    import sys

    parser = argparse.ArgumentParser(prog="duplex bench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args, overrides = parser.parse_known_args(["pipeline", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args, overrides) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""`duplex bench turn --session`: time to first agent audio measured through the session.

Each turn is a fresh ``VoiceSession`` on the running pipeline, driven as a transport drives it:
20 ms of caller audio pushed and one output frame pulled every 20 ms on the wall clock (the
utterance, then silence). So the session's own VAD decides where speech ended and when the turn
ends, and preemptive generation runs as in service. The number is the session's own: end of
user speech (its VAD) -> first agent frame handed to the transport (``duplex.metrics`` ttfa_ms);
the edge's codec and network are not in it. Preemption off and on alternate turn by turn, so
load on the machine falls on both alike.

``--metrics-cost`` alternates the server's metrics off and on instead (preemption as the pipeline
sets it): on, each session has the server's metrics tap (``duplex.server.metrics``) and the
metrics are rendered every 0.5 s, as a Prometheus scrape of ``/metrics`` would make them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from duplex.config import load_pipeline
from duplex.config.pipeline import PipelineConfig
from duplex.config.session import SessionConfig
from duplex.runtime.contract import SESSION_RATE
from duplex.session.door import SimpleDoor
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex_tools.report import percentile, table

MODES = ("off", "on")
FRAME_MS = 20
RATE = SESSION_RATE
SCRAPE_S = 0.5


@dataclass
class SessionTurn:
    mode: str
    utterance: str
    ttfa_ms: float | None = None
    heard: str = ""
    reply: str = ""
    preemptive_starts: int = 0
    preemptive_aborts: int = 0
    audio_ready_ms: int | None = None  # agent audio already made when the turn ended (preemption on)


def mode_configs(session_settings: dict) -> dict[str, SessionConfig]:
    base = SessionConfig.model_validate(session_settings)
    preempt = base.preemptive_generation
    configs = {}
    for mode in MODES:
        toggled = preempt.model_copy(update={"enabled": mode == "on"})
        configs[mode] = base.model_copy(update={"preemptive_generation": toggled})
    return configs


async def _scraping(metrics) -> None:
    while True:
        await metrics.render()
        await asyncio.sleep(SCRAPE_S)


async def _one_turn(runtime, config: SessionConfig, mode: str, name: str, text: str, audio: np.ndarray,
                    timeout_s: float, metrics=None) -> SessionTurn:
    from duplex.session.session import VoiceSession

    turn = SessionTurn(mode, text)
    events: list[ev.ServerEvent] = []
    output = OutputFormat(sample_rate=RATE, channels=1)
    tap = metrics.tap("bench", output) if metrics is not None else None

    def send(event: ev.ServerEvent) -> None:
        events.append(event)
        if tap is not None:
            tap.event(event, None)

    session = VoiceSession(name, runtime, config, SimpleDoor("bench", output, send))
    scraper = None
    if tap is not None:
        session.tap = tap
        scraper = asyncio.create_task(_scraping(metrics))
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    step = RATE * FRAME_MS // 1000
    started = time.monotonic()
    try:
        for index in range(int(timeout_s * 1000 / FRAME_MS)):
            due = started + index * FRAME_MS / 1000
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            chunk = pcm[index * step:(index + 1) * step]
            session.push_input(chunk if len(chunk) == step else np.zeros(step, np.int16), arrival=due)
            session.pull_output(due)
            if session.last_ttfa_ms is not None:
                break
    finally:
        if scraper is not None:
            scraper.cancel()
        await session.close()
    turn.ttfa_ms = session.last_ttfa_ms
    turn.preemptive_starts = session.counters.preemptive_starts
    turn.preemptive_aborts = session.counters.preemptive_aborts
    for event in events:
        if isinstance(event, ev.TranscriptionCompleted):
            turn.heard = event.transcript
        elif isinstance(event, ev.AudioTranscriptDelta):
            turn.reply += event.delta
        elif isinstance(event, ev.PreemptiveCommitted):
            turn.audio_ready_ms = event.audio_ready_ms
    return turn


async def _wave(runtime, config: SessionConfig, mode: str, index: int, utterances: list, callers: int,
                stagger_s: float, metrics=None) -> list[SessionTurn]:
    """``callers`` sessions at once, each starting ``stagger_s`` after the one before (so their
    ends of speech overlap without all landing in the same frame), each its own utterance."""

    async def caller(k: int) -> SessionTurn:
        await asyncio.sleep(k * stagger_s)  # the wave's schedule, not a wait for anything
        text, audio, _ = utterances[(index + k) % len(utterances)]
        audio = np.concatenate([audio, np.zeros(RATE * 15, np.float32)])  # the caller then stays quiet
        name = f"sess_bench-{mode}-{index}" + (f"-{k}" if callers > 1 else "")
        return await _one_turn(runtime, config, mode, name, text, audio, 15.0 + 2.0 * callers, metrics)

    return list(await asyncio.gather(*(caller(k) for k in range(callers))))


async def measure(args, overrides: list[str], progress: bool = True, pipeline: PipelineConfig | None = None,
                  mark: Callable[[str], None] | None = None) -> dict:
    """``pipeline``: this config instead of ``args.config`` with the overrides (the services bench);
    ``mark("measured")`` is called once the warmups are done, ``mark("done")`` after the last turn
    with the pipeline still up (what the services bench counts CPU between)."""
    from duplex.models.registry import BUILDERS
    from duplex.runtime.coordinator import Coordinator
    from duplex.server.metrics import ServerMetrics
    from duplex.server.runtime_adapter import CoordinatorRuntime
    from duplex.session.manager import SessionManager
    from duplex_tools.bench.turn_pipeline import _utterance_audio

    utterances = _utterance_audio()
    cfg = pipeline or load_pipeline(args.config, overrides)
    metrics_cost = getattr(args, "metrics_cost", False)
    # silence-ended turns (preemption is theirs), whatever the pipeline's sessions default to
    settings = {**cfg.session.model_dump(), "turn_detection": "server_vad"}
    configs = mode_configs(settings)
    if metrics_cost:  # both modes as the pipeline sets preemption; what differs is the metrics
        configs = {mode: SessionConfig.model_validate(settings) for mode in MODES}
    callers = getattr(args, "callers", 1)
    stagger_s = getattr(args, "stagger_ms", 0) / 1000
    load_before = os.getloadavg()[0]
    turns: list[SessionTurn] = []
    async with Coordinator(cfg, BUILDERS) as coordinator:
        runtime = CoordinatorRuntime(coordinator)
        metrics = ServerMetrics(coordinator, SessionManager(runtime, configs["on"], 1, cfg.name))
        if progress:
            toggled = "metrics" if metrics_cost else "preemption"
            print(f"pipeline {cfg.name!r} up; {args.warmup} warmup + {args.turns} turns per mode "
                  f"({toggled} off/on alternating, pause {configs['on'].preemptive_generation.pause_ms} ms, "
                  f"end of turn {configs['on'].vad.silence_ms} ms)", flush=True)
        for index in range(args.warmup + args.turns):
            if index == args.warmup and mark is not None:
                mark("measured")
            for mode in MODES:
                watched = metrics if metrics_cost and mode == "on" else None
                wave = await _wave(runtime, configs[mode], mode, index, utterances, callers, stagger_s, watched)
                if progress:
                    label = "warmup" if index < args.warmup else f"turn {index - args.warmup + 1}/{args.turns}"
                    what = "metrics" if metrics_cost else "preemption"
                    for turn in wave:
                        shown = f"{turn.ttfa_ms:.0f} ms" if turn.ttfa_ms is not None else "no audio"
                        print(f"  {label} {what} {mode:>3}: ttfa {shown}  speculations {turn.preemptive_starts} "
                              f"(aborted {turn.preemptive_aborts})  heard {turn.heard!r} -> {turn.reply!r}",
                              flush=True)
                if index >= args.warmup:
                    turns.extend(wave)
                await coordinator.wait_idle(timeout=30)
        if mark is not None:
            mark("done")
    return {"config": cfg.name, "mode": "session", "compare": "metrics" if metrics_cost else "preemption",
            "cpus": os.cpu_count(), "callers": callers, "stagger_ms": stagger_s * 1000,
            "pause_ms": configs["on"].preemptive_generation.pause_ms, "silence_ms": configs["on"].vad.silence_ms,
            "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
            "turns": [asdict(t) for t in turns], "summary": summarize(turns)}


def summarize(turns: list[SessionTurn]) -> dict:
    summary = {}
    for mode in MODES:
        mine = [t for t in turns if t.mode == mode]
        values = [t.ttfa_ms for t in mine if t.ttfa_ms is not None]
        summary[mode] = {"turns": len(mine), "turns_with_audio": len(values),
                         "p50": percentile(values, 50), "p95": percentile(values, 95),
                         "mean": float(np.mean(values)) if values else float("nan"),
                         "speculations": sum(t.preemptive_starts for t in mine),
                         "speculations_aborted": sum(t.preemptive_aborts for t in mine)}
    return summary


def render(results: dict, target_ms: float = 1200.0) -> str:
    summary = results["summary"]
    if results.get("compare") == "metrics":
        rows = [[f"metrics {mode}", s["p50"], s["p95"], s["mean"], f"{s['turns_with_audio']}/{s['turns']}"]
                for mode, s in summary.items()]
        text = table(["end of user speech -> first agent frame", "p50 ms", "p95 ms", "mean ms", "turns with audio"],
                     rows)
        off, on = summary["off"]["p50"], summary["on"]["p50"]
        return text + f"\nmetrics on - off at p50: {on - off:+.0f} ms (on/off {on / off:.3f})"
    rows = [[f"preemption {mode}", s["p50"], s["p95"], s["mean"], f"{s['turns_with_audio']}/{s['turns']}",
             f"{s['speculations']} ({s['speculations_aborted']} aborted)"] for mode, s in summary.items()]
    text = table(["end of user speech -> first agent frame", "p50 ms", "p95 ms", "mean ms", "turns with audio",
                  "speculations"], rows)
    off, on = summary["off"]["p50"], summary["on"]["p50"]
    load = results["load_avg_1m"]
    return (text + f"\npreemption saves {off - on:.0f} ms at p50 (on/off {on / off:.2f}); "
            f"p50 with preemption {'meets' if on <= target_ms else 'misses'} the {target_ms / 1000:.1f} s target"
            f"\nmachine: {results['cpus']} cpus, load average {load['before']:.1f} before, {load['after']:.1f} after")

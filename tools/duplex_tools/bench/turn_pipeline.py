"""`duplex bench turn` through the pipeline: time to first agent audio after the user stops speaking,
split by stage (the command line is ``turn.py``).

Each turn streams a synthesized utterance into the pipeline in real time (``--chunk-ms`` chunks),
then ``--hangover-ms`` of silence (the session's VAD waits that long before it ends the turn),
then ends the turn. Times are taken where the coordinator receives each output:

    speech end -> turn end (VAD hangover) -> final transcript (ASR tail) -> first reply token
    -> text that completes the first phrase (thinker first phrase) -> first audio (TTS first chunk)

The edge (codec, RTP/WebRTC pacing, network) is not in this loop; its share is measured by the
edge's own benchmarks. Turns run one after another, each in a fresh session (a first turn: no
history to prefill) unless ``--same-session``.

The utterances and their audio (``_utterance_audio``) are shared with ``turn_session.py`` and
``turn_engine.py``.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from duplex.audio import resample
from duplex.config import load_pipeline
from duplex.config.session import VadConfig
from duplex.runtime.contract import SESSION_RATE, AgentAudio, AgentText, CallerAudio, Transcript, TurnRequest
from duplex.session.vad import FrameClassifier
from duplex_tools.report import percentile, table

UTTERANCES = (
    "I would like a bubble tea with less ice.",
    "Can I get a large taro milk tea with pearls?",
    "What toppings do you have?",
    "How much is a regular mango tea?",
    "One brown sugar milk tea, please.",
)
SAMPLE_RATE = SESSION_RATE
SPLITS = ("vad_hangover", "asr_tail", "thinker_first_token", "thinker_first_phrase", "tts_first_chunk")


@dataclass
class TurnTiming:
    utterance: str
    heard: str = ""
    reply: str = ""
    status: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # SPLITS + "ttfa"
    partials: int = 0
    agent_audio_s: float = 0.0


def _utterance_audio() -> list[tuple[str, np.ndarray, int]]:
    """(text, 16 kHz audio, sample index where speech ends) per utterance, made with Piper."""
    from duplex.models.local.assets import piper_voice_paths
    from duplex.models.local.tts import PiperSynth

    synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
    made = []
    for text in UTTERANCES:
        audio = resample(synth.synthesize(text), synth.sample_rate, SAMPLE_RATE)
        classifier = FrameClassifier(VadConfig())
        voiced, frame = _voiced(classifier, audio), classifier.frame_samples
        last = len(voiced) - voiced[::-1].index(True) if any(voiced) else 0
        made.append((text, np.concatenate([np.zeros(SAMPLE_RATE // 5, np.float32), audio[: last * frame]]),
                     SAMPLE_RATE // 5 + last * frame))
    return made


def _voiced(classifier: FrameClassifier, audio: np.ndarray) -> list[bool]:
    """The session's VAD verdict per whole frame of ``audio`` (the ASR takes these, as from a session)."""
    frame = classifier.frame_samples
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    return [classifier.is_voiced(pcm[i:i + frame]) for i in range(0, len(pcm) - len(pcm) % frame, frame)]


async def _one_turn(coordinator, text: str, audio: np.ndarray, speech_end: int, session: str, args) -> TurnTiming:
    from duplex.models.local.tts import PhraseSplitter
    from duplex.runtime.requests import OutputChunk

    classifier = FrameClassifier(VadConfig())
    frame = classifier.frame_samples
    step = max(frame, SAMPLE_RATE * args.chunk_ms // 1000 // frame * frame)  # whole VAD frames per chunk
    audio = np.concatenate([audio, np.zeros(SAMPLE_RATE * args.hangover_ms // 1000, np.float32)])
    handle = coordinator.submit(TurnRequest(session_id=session, turn=0))
    started = time.monotonic()
    t_speech_end = t_eos = 0.0
    for offset in range(0, len(audio), step):
        # Real-time pacing against a fixed schedule, so sleeps do not add up drift.
        await asyncio.sleep(max(0.0, started + offset / SAMPLE_RATE - time.monotonic()))
        eos = offset + step >= len(audio)
        chunk = audio[offset : offset + step]
        chunk = chunk[: len(chunk) - len(chunk) % frame]
        coordinator.feed(handle.request_id, CallerAudio(chunk, _voiced(classifier, chunk), classifier.config.frame_ms),
                         eos=eos)
        if offset < speech_end <= offset + step:
            t_speech_end = time.monotonic()
        if eos:
            t_eos = time.monotonic()
    timing = TurnTiming(text)
    marks: dict[str, float] = {}
    splitter = PhraseSplitter()  # the tts stage's default cuts
    reply: list[str] = []
    async for event in handle:
        if not isinstance(event, OutputChunk):
            timing.status = event.status.value
            break
        at, data = event.received_ns / 1e9, event.data
        if isinstance(data, Transcript):
            timing.partials += not data.final
            if data.final:
                marks.setdefault("asr", at)
                timing.heard = data.text
        elif isinstance(data, AgentText) and data.text:
            marks.setdefault("token", at)
            reply.append(data.text)
            if splitter.push(data.text):
                marks.setdefault("phrase", at)
        elif event.stage == "thinker" and event.final:
            timing.reply = "".join(reply).strip()
            marks.setdefault("phrase", at)  # a reply shorter than a phrase is spoken at its end
        elif isinstance(data, AgentAudio):
            marks.setdefault("audio", at)
            timing.agent_audio_s += data.seconds
    if {"asr", "token", "phrase", "audio"} <= marks.keys():
        timing.seconds = {
            "vad_hangover": t_eos - t_speech_end,
            "asr_tail": marks["asr"] - t_eos,
            "thinker_first_token": marks["token"] - marks["asr"],
            "thinker_first_phrase": marks["phrase"] - marks["asr"],
            "tts_first_chunk": marks["audio"] - marks["phrase"],
            "ttfa": marks["audio"] - t_speech_end,
        }
    return timing


async def measure(args, overrides: list[str], progress: bool = True) -> dict:
    from duplex.models.registry import BUILDERS
    from duplex.runtime.coordinator import Coordinator

    utterances = _utterance_audio()
    cfg = load_pipeline(args.config, overrides)
    load_before = os.getloadavg()[0]
    turns: list[TurnTiming] = []
    load_start = time.monotonic()
    async with Coordinator(cfg, BUILDERS) as coordinator:
        startup_s = time.monotonic() - load_start
        if progress:
            print(f"pipeline {cfg.name!r} up in {startup_s:.1f} s; {args.warmup} warmup + {args.turns} turns",
                  flush=True)
        for index in range(args.warmup + args.turns):
            text, audio, speech_end = utterances[index % len(utterances)]
            session = "bench" if args.same_session else f"bench-{index}"
            timing = await _one_turn(coordinator, text, audio, speech_end, session, args)
            if progress:
                label = "warmup" if index < args.warmup else f"turn {index - args.warmup + 1}/{args.turns}"
                ttfa = timing.seconds.get("ttfa")
                shown = f"{ttfa:.3f} s" if ttfa is not None else f"no audio ({timing.status})"
                print(f"  {label}: ttfa {shown}  heard {timing.heard!r} -> {timing.reply!r}", flush=True)
            if index >= args.warmup:
                turns.append(timing)
            await coordinator.wait_idle(timeout=30)
    # Other work on the machine shows up in every number here: the load is part of the result.
    return {"config": cfg.name, "startup_s": startup_s, "hangover_ms": args.hangover_ms,
            "chunk_ms": args.chunk_ms, "cpus": os.cpu_count(),
            "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
            "turns": [asdict(t) for t in turns], "summary": summarize(turns)}


def summarize(turns: list[TurnTiming]) -> dict:
    measured = [t for t in turns if t.seconds]
    summary: dict[str, Any] = {"turns": len(turns), "turns_with_audio": len(measured)}
    for key in (*SPLITS, "ttfa"):
        values = [t.seconds[key] for t in measured]
        summary[key] = {"p50": percentile(values, 50), "p95": percentile(values, 95),
                        "mean": float(np.mean(values)) if values else float("nan")}
    return summary


def render(results: dict, target_s: float = 1.2) -> str:
    summary = results["summary"]
    rows = [[key, summary[key]["p50"] * 1e3, summary[key]["p95"] * 1e3, summary[key]["mean"] * 1e3]
            for key in (*SPLITS, "ttfa")]
    rows.append(["edge (codec, pacing, network)", "n/a", "n/a", "n/a"])
    text = table(["from end of user speech", "p50 ms", "p95 ms", "mean ms"], rows)
    ttfa = summary["ttfa"]["p50"]
    verdict = "meets" if ttfa <= target_s else "misses"
    load = results["load_avg_1m"]
    return (text + f"\nmachine: {results['cpus']} cpus, load average {load['before']:.1f} before, "
            f"{load['after']:.1f} after (the pipeline itself adds up to ~1)"
            f"\n{summary['turns_with_audio']}/{summary['turns']} turns produced audio; "
            f"ttfa p50 {ttfa:.3f} s {verdict} the {target_s:.1f} s target "
            f"(ttfa = vad_hangover + asr_tail + thinker_first_phrase + tts_first_chunk)")


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [t for t in results["turns"] if t["seconds"]]
    parts = ("vad_hangover", "asr_tail", "thinker_first_phrase", "tts_first_chunk")
    fig, ax = plt.subplots(figsize=(max(6, len(turns) * 0.6), 4))
    bottom = np.zeros(len(turns))
    for part in parts:
        values = np.array([t["seconds"][part] for t in turns])
        ax.bar(range(len(turns)), values, bottom=bottom, label=part)
        bottom += values
    ax.axhline(1.2, color="black", linestyle="--", linewidth=1, label="1.2 s target")
    ax.set_xlabel("turn")
    ax.set_ylabel("seconds from end of user speech")
    ax.set_title(f"time to first audio by stage ({results['config']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")

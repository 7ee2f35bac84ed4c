"""One PNG per scenario: the caller's audio and the server's VAD above, the agent's audio and
response events below, TTFB and barge-in stop times drawn as labelled bars."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from duplex_tools.scenario.measure import ScenarioResult
from duplex_tools.scenario.recording import Recording

USER, AGENT, VAD, CUT, TTFB = "#1f77b4", "#ff7f0e", "#9ecae1", "#d62728", "#2ca02c"


def plot_timeline(rec: Recording, result: ScenarioResult, path: str | Path) -> str:
    t0 = rec.t0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 5), sharex=True, gridspec_kw={"hspace": 0.08})
    _audio(top, [(a - t0, r) for a, r in rec.sent], USER, "caller mic (sent)")
    _vad_spans(top, rec, t0)
    _audio(bottom, [(a - t0, r) for a, r, _ in rec.heard], AGENT, "agent audio (heard)")
    _events(bottom, rec, t0)
    for step in result.steps:
        if step.onset_s is not None:
            height = 0.95 if step.index % 2 == 0 else 0.84  # neighbours' labels do not overprint
            top.annotate(_short(step.title), (step.onset_s, top.get_ylim()[1] * height), fontsize=7,
                         ha="left", va="top", color="#333333")
        if step.cut_response and step.onset_s is not None:
            for ax in (top, bottom):
                ax.axvline(step.onset_s, color=CUT, linestyle="--", linewidth=1)
            if step.stop_ms is not None:
                _bar(bottom, step.onset_s, step.stop_ms, 0.85, CUT, f"stop {step.stop_ms:.0f} ms")
        if step.ttfb_ms is not None and step.end_s is not None:
            _bar(bottom, step.end_s, step.ttfb_ms, 0.7, TTFB, f"TTFB {step.ttfb_ms:.0f} ms")
    top.set_title(f"{result.name}: {result.status}" + (f"  ({result.failures[0]})" if result.failures else ""),
                  fontsize=10, color="black" if result.passed else CUT, loc="left")
    bottom.set_xlabel("seconds since the call's first microphone frame (client clock)")
    for ax in (top, bottom):
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def _audio(ax, points: list[tuple[float, float]], color: str, label: str) -> None:
    if points:
        times, levels = zip(*points)
        ax.fill_between(times, levels, step="post", color=color, alpha=0.6, label=label, linewidth=0)
        ax.set_ylim(0, max(0.05, max(levels) * 1.25))
    ax.set_ylabel("RMS", fontsize=8)
    ax.tick_params(labelsize=7)


def _vad_spans(ax, rec: Recording, t0: float) -> None:
    starts = [e["audio_start_ms"] / 1000 for _, e in rec.events_of("input_audio_buffer.speech_started")]
    stops = [e["audio_end_ms"] / 1000 for _, e in rec.events_of("input_audio_buffer.speech_stopped")]
    for index, start in enumerate(starts):
        stop = stops[index] if index < len(stops) else (rec.finished_at - t0)
        ax.axvspan(start, stop, color=VAD, alpha=0.35, label="server VAD: speech" if index == 0 else None)


def _events(ax, rec: Recording, t0: float) -> None:
    marks = {"response.created": ("v", "black", "response.created"),
             "output_audio_buffer.stopped": ("s", "grey", "audio stopped"),
             "output_audio_buffer.cleared": ("x", CUT, "audio cleared (barge-in)")}
    top = ax.get_ylim()[1]
    for kind, (marker, color, label) in marks.items():
        times = [at - t0 for at, _ in rec.events_of(kind)]
        if times:
            ax.scatter(times, [top * 0.97] * len(times), marker=marker, color=color, s=25, label=label, zorder=3)


def _bar(ax, start_s: float, length_ms: float, height_share: float, color: str, label: str) -> None:
    y = ax.get_ylim()[1] * height_share
    ax.plot([start_s, start_s + length_ms / 1000], [y, y], color=color, linewidth=2.5)
    ax.annotate(label, (start_s, y), xytext=(0, 3), textcoords="offset points", fontsize=7, color=color)


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

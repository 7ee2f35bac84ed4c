"""The PNG of `duplex bench turn-taking`: take-over rate per category and the latencies of
each mode, side by side."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

LATENCIES = (("ttfb_ms", "end of speech\n-> first audio"), ("stop_ms", "onset\n-> agent silent"),
             ("answer_ms", "interruption\n-> its answer"), ("resume_ms", "false onset's end\n-> resumed"))


def plot(report: dict, path: Path) -> None:
    modes = list(report["modes"])
    categories = sorted({c for cats in report["modes"].values() for c in cats})
    fig, (rates, latency) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(modes)
    x = np.arange(len(categories))
    for i, mode in enumerate(modes):
        values = [report["modes"][mode].get(c, {}).get("rate") or 0.0 for c in categories]
        bars = rates.bar(x + i * width, values, width, label=mode)
        rates.bar_label(bars, fmt="%.2f", fontsize=8)
    rates.set_xticks(x + width * (len(modes) - 1) / 2, categories)
    rates.set_ylim(0, 1.3)
    rates.set_ylabel("take-over rate")
    rates.set_title("take-over rate: the agent took the floor (lower is better;\n"
                    "question: answered, interruption: yielded and answered, higher is better)", fontsize=10)
    rates.legend(loc="upper center", ncols=len(modes), fontsize=8)
    groups = [(key, label, c) for key, label in LATENCIES for c in categories  # only what was measured
              if any(report["modes"][m].get(c, {}).get(key, {}).get("n") for m in modes)]
    x = np.arange(len(groups))
    for i, mode in enumerate(modes):
        p50s, p95s = [], []
        for key, _, category in groups:
            spread = report["modes"][mode].get(category, {}).get(key, {})
            measured = bool(spread.get("n"))
            p50s.append(spread["p50"] if measured else 0.0)
            p95s.append(spread["p95"] if measured else 0.0)
        bars = latency.bar(x + i * width, p50s, width, label=mode,
                           yerr=[np.zeros(len(p50s)), np.subtract(p95s, p50s)], capsize=3)  # whisker: p95
        latency.bar_label(bars, labels=[f"{v:.0f}" if v else "-" for v in p50s], fontsize=8,  # -: not measured
                          label_type="center", color="white")
    latency.set_xticks(x + width * (len(modes) - 1) / 2, [f"{label}\n({c})" for _, label, c in groups], fontsize=8)
    latency.set_ylabel("ms (bar p50, whisker p95)")
    latency.set_title(f"latencies, {report['config']} pipeline, {report.get('voice', 'piper')} caller")
    latency.set_ylim(0, latency.get_ylim()[1] * 1.2)  # room for the legend above the whiskers
    latency.legend(loc="upper center", ncols=len(modes), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

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
    rates.set_ylim(0, 1.15)
    rates.set_ylabel("take-over rate")
    rates.set_title("take-overs (interruption: yielded and answered, higher is better)")
    rates.legend()
    x = np.arange(len(LATENCIES))
    for i, mode in enumerate(modes):
        values = []
        for key, _ in LATENCIES:
            p50s = [s[key]["p50"] for s in report["modes"][mode].values() if s[key]["n"]]
            values.append(float(np.median(p50s)) if p50s else 0.0)
        bars = latency.bar(x + i * width, values, width, label=mode)
        latency.bar_label(bars, labels=[f"{v:.0f}" if v else "-" for v in values], fontsize=8)  # -: not measured
    latency.set_xticks(x + width * (len(modes) - 1) / 2, [label for _, label in LATENCIES], fontsize=8)
    latency.set_ylabel("ms (p50)")
    latency.set_title(f"latencies, {report['config']} pipeline")
    latency.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The PNG of `duplex bench services`: end of speech -> first agent frame (p50 bar, p95 tick) per
pipeline and preemption mode, one panel per caller count, and duplex's own CPU per turn beside
the servers'."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

MODE_COLOURS = {"off": "#8fb3d9", "on": "#2e6ca4"}


def plot_services(results: dict, path: str | Path, command: str = "duplex bench services") -> str:
    runs = list(results["runs"].values())
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(5.5 * (len(runs) + 1), 5.2), squeeze=False)
    for ax, run in zip(axes[0], runs):
        _latency(ax, run)
    _cpu(axes[0][-1], runs)
    fig.suptitle(f"Speech in process vs on servers, through the session ({results['cpus']} shared cores)\n"
                 f"{command}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _latency(ax, run: dict) -> None:
    names = list(run["pipelines"])
    width = 0.38
    for k, mode in enumerate(MODE_COLOURS):
        xs = [n + (k - 0.5) * width for n in range(len(names))]
        p50 = [run["pipelines"][name]["summary"][mode]["p50"] for name in names]
        p95 = [run["pipelines"][name]["summary"][mode]["p95"] for name in names]
        ax.bar(xs, p50, width, color=MODE_COLOURS[mode], label=f"preemption {mode}: p50")
        ax.scatter(xs, p95, marker="_", s=300, color="black", label="p95" if k else None)
    ax.set_xticks(range(len(names)), [name.replace(" (", "\n(") for name in names], fontsize=7)
    ax.set_ylabel("end of user speech -> first agent frame (ms)")
    ax.set_title(f"{run['callers']} caller(s) at once", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def _cpu(ax, runs: list[dict]) -> None:
    names = list(runs[0]["pipelines"])
    width = 0.8 / len(runs)
    for k, run in enumerate(runs):
        xs = [n + (k - (len(runs) - 1) / 2) * width for n in range(len(names))]
        duplex = [run["pipelines"][name]["duplex_cpu_s_per_turn"] for name in names]
        servers = [run["pipelines"][name]["servers_cpu_s_per_turn"] for name in names]
        ax.bar(xs, duplex, width, color=f"C{k}", label=f"duplex, {run['callers']} caller(s)")
        ax.bar(xs, servers, width, bottom=duplex, color=f"C{k}", alpha=0.35,
               label=f"servers, {run['callers']} caller(s)")
    ax.set_xticks(range(len(names)), [name.replace(" (", "\n(") for name in names], fontsize=7)
    ax.set_ylabel("CPU seconds per turn (one call each)")
    ax.set_title("duplex's own process tree (solid) and the servers' (light)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)

"""The PNG of `duplex bench soak`: the server's RSS (in all and per process), open fds, threads,
/dev/shm segments and what its stages hold, against the barge-ins made; the end of warm-up
marked, and the idle samples (after warm-up, at the end) drawn as points."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from duplex_tools.bench.soak_sample import Sample

IDLE_PHASES = ("before", "warmed", "final")


def plot_soak(samples: list[Sample], warmup: int, path: str | Path, title: str) -> str:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (rss, fds), (threads, held) = axes
    x = [s.barge_ins for s in samples]
    rss.plot(x, [s.rss_mib for s in samples], "-", label="all server processes")
    for group in sorted({g for s in samples for g in s.rss_by_process}):
        rss.plot(x, [s.rss_by_process.get(group, float("nan")) for s in samples], "-", lw=0.8, label=group)
    rss.set_ylabel("resident memory (MiB)")
    fds.plot(x, [s.fds for s in samples], "-", label="open fds")
    fds.set_ylabel("open file descriptors")
    threads.plot(x, [s.threads for s in samples], "-", label="threads")
    threads.set_ylabel("threads")
    held.plot(x, [s.shm_segments for s in samples], "-", label="/dev/shm segments")
    held.plot(x, [sum(s.held.values()) for s in samples], "-", label="held by stages (requests, slots, blocks)")
    held.plot(x, [s.live_calls for s in samples], ":", label="live calls")
    held.set_ylabel("count")
    idle = [s for s in samples if s.phase in IDLE_PHASES]
    for ax, value in ((rss, lambda s: s.rss_mib), (fds, lambda s: s.fds), (threads, lambda s: s.threads),
                      (held, lambda s: s.shm_segments)):
        ax.plot([s.barge_ins for s in idle], [value(s) for s in idle], "o", color="black", ms=4, label="idle")
        ax.axvline(warmup, color="purple", linestyle="--", alpha=0.6, label="end of warm-up")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("barge-ins made")
    fig.suptitle(title, fontsize=10)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return str(path)

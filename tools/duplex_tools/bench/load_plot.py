"""The PNG of `duplex bench load`: latency, barge-in, CPU and frame curves against sessions,
with the knee marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STOP_BUDGET_MS = 200.0


def plot_load(rows: list[dict], knee: int | None, path: str | Path, title: str) -> str:
    """Rows of one server, or of two (``variant``: the arguments the second one was started with,
    ``--versus``): then each curve is drawn per server, the second dashed."""
    variants = list(dict.fromkeys(r.get("variant", "") for r in rows))
    sessions = sorted({r["sessions"] for r in rows})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (ttfb, stop), (cpu, frames) = axes
    cpu.axhline(rows[0]["machine_cores"] if rows else 1, color="grey", linestyle=":", label="cores on this machine")
    stop.axhline(STOP_BUDGET_MS, color="red", linestyle=":", label=f"budget {STOP_BUDGET_MS:.0f} ms")
    for n, variant in enumerate(variants):
        _plot_server([r for r in rows if r.get("variant", "") == variant], axes, dashed=n > 0,
                     suffix=f" ({variant})" if variant else (" (as given)" if len(variants) > 1 else ""))
    ttfb.set_ylabel("end of speech -> first agent audio (ms)")
    stop.set_ylabel("barge-in onset -> agent silent (ms)")
    cpu.set_ylabel("CPU (cores)")
    frames.set_ylabel("%")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sessions, [str(s) for s in sessions])
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        if knee is not None:
            ax.axvline(knee, color="purple", linestyle="--", alpha=0.6)
    for ax in axes[1]:
        ax.set_xlabel("concurrent sessions")
    fig.suptitle(title + (f" - knee at {knee} session(s)" if knee else " - knee below the lowest level"), fontsize=10)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def _plot_server(rows: list[dict], axes, dashed: bool, suffix: str) -> None:
    (ttfb, stop), (cpu, frames) = axes
    line = "--" if dashed else "-"
    sessions = [r["sessions"] for r in rows]
    for q, marker in (("p50", "o"), ("p95", "s"), ("p99", "^")):
        ttfb.plot(sessions, [r["ttfb_ms"][q] for r in rows], line + marker, label=f"TTFB {q}{suffix}")
        stop.plot(sessions, [r["stop_ms"][q] for r in rows], line + marker, label=f"stop {q}{suffix}")
    server = [r["server_cpu_cores"] for r in rows]
    if any(v is not None for v in server):
        cpu.plot(sessions, [v if v is not None else float("nan") for v in server], line + "o",
                 label=f"server (edge + stages){suffix}")
    cpu.plot(sessions, [r["client_cpu_cores"] for r in rows], line + "s", label=f"callers{suffix}")
    cpu.plot(sessions, [r.get("machine_busy_cores", float("nan")) for r in rows], line + "^",
             label=f"whole machine busy{suffix}")
    share = lambda count, r: 100.0 * count / r["frames_heard"] if r["frames_heard"] else float("nan")
    frames.plot(sessions, [share(r["frames_lost"], r) for r in rows], line + "o", label=f"agent frames lost %{suffix}")
    frames.plot(sessions, [share(r["frames_late"], r) for r in rows], line + "s",
                label=f"agent frames late % (drop-outs){suffix}")
    frames.plot(sessions, [100.0 * r["calls_failed"] / max(r["calls"], 1) for r in rows], line + "^",
                label=f"calls failed %{suffix}")

"""The corpus' numbers: take-over rates per Full-Duplex-Bench category for each way of deciding,
side by side, broken down by condition, variant and speaker; the targets beside them; a PNG heat
map of take-overs by variant x condition."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from duplex_tools.report import percentile, table
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.evaluate import Outcome

# category -> (what a take-over is, target on the held-out part, target on the phone line)
MEANING = {"pause": ("took over a mid-sentence pause", "<= 0.10", "<= 0.15"),
           "backchannel": ("cut its reply for a backchannel", "<= 0.10", "<= 0.15"),
           "noise": ("cut its reply for a noise", "<= 0.05", "<= 0.10"),
           "interruption": ("yielded to a real interruption", ">= 0.95", ">= 0.90"),
           "smooth": ("answered a complete turn", "(higher is better)", "")}
FLOOR_NOTE = "synthetic speakers and noises: a floor, not proof of hearing real callers"
TAKEOVER_WANTED = frozenset({"interruption", "smooth"})  # categories where a take-over is the right answer


def _rate(outcomes: Iterable[Outcome]) -> tuple[float, int, int]:
    chosen = list(outcomes)
    hits = sum(o.takeover for o in chosen)
    return (hits / len(chosen) if chosen else float("nan")), hits, len(chosen)


def grouped(outcomes: list[Outcome], key: Callable[[Outcome], Any]) -> dict[Any, list[Outcome]]:
    groups: dict[Any, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        groups[key(o)].append(o)
    return groups


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """way -> category -> {rate, hits, clips, phone rate, latency p50/p95}; and the breakdowns."""
    out: dict[str, Any] = {"ways": {}, "by_condition": {}, "by_variant": {}, "by_speaker": {}}
    for way, of_way in grouped(outcomes, lambda o: o.way).items():
        cats: dict[str, Any] = {}
        for category, chosen in grouped(of_way, lambda o: o.clip.category).items():
            rate, hits, n = _rate(chosen)
            phone = _rate(o for o in chosen if o.clip.condition == "phone")[0]
            latencies = [o.latency_ms for o in chosen if o.latency_ms is not None]
            cats[category] = {"rate": rate, "hits": hits, "clips": n, "phone_rate": phone,
                              "latency_p50_ms": percentile(latencies, 50) if latencies else None,
                              "latency_p95_ms": percentile(latencies, 95) if latencies else None}
        out["ways"][way] = cats
        for name, key in (("by_condition", lambda o: (o.clip.category, o.clip.condition)),
                          ("by_variant", lambda o: (o.clip.category, o.clip.variant)),
                          ("by_speaker", lambda o: (o.clip.category, o.clip.speaker.name))):
            out[name][way] = {f"{c}|{k}": _rate(chosen)[0] for (c, k), chosen in grouped(of_way, key).items()}
    return out


def print_report(outcomes: list[Outcome], split: str) -> dict[str, Any]:
    report = summary(outcomes)
    rows = []
    for category in spec.CATEGORIES:
        for way, cats in report["ways"].items():
            s = cats.get(category)
            if s is None:
                continue
            p50, p95 = s["latency_p50_ms"], s["latency_p95_ms"]
            rows.append([category, way, f"{s['rate']:.3f} ({s['hits']}/{s['clips']})", f"{s['phone_rate']:.3f}",
                         "" if p50 is None else f"{p50:.0f}", "" if p95 is None else f"{p95:.0f}",
                         MEANING[category][1], MEANING[category][2]])
    print(f"corpus part: {split} ({FLOOR_NOTE})")
    # p95 beside p50: a share of turns left waiting for the longest pause shows only in the tail
    print(table(["category", "way", "take-over rate", "phone", "latency p50 ms", "p95", "target", "phone target"],
                rows))
    print("take-over: " + "; ".join(f"{c}: {m[0]}" for c, m in MEANING.items()))
    print("latency: interruption = onset -> verdict; smooth = end of speech -> end of turn")
    rows = []
    for way, rates in report["by_condition"].items():
        for category in spec.CATEGORIES:
            rows.append([way, category, *(rates.get(f"{category}|{c}", float("nan")) for c in spec.CONDITIONS)])
    print(table(["way", "category", *spec.CONDITIONS], rows))
    worst = []
    for way, rates in report["by_variant"].items():
        for key, rate in rates.items():
            category = key.split("|")[0]
            if category in ("backchannel", "noise") and rate > 0.3:
                worst.append([way, key, rate])
    if worst:
        print("variants above 0.3 (backchannel / noise):")
        print(table(["way", "variant", "rate"], sorted(worst)))
    return report


def heat_map(outcomes: list[Outcome], path: Path, command: str,
             categories: tuple[str, ...] = spec.CATEGORIES) -> None:
    """Take-over rate by variant (rows) x condition (columns) of ``categories``, one panel per way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ways = list(dict.fromkeys(o.way for o in outcomes))
    rows = [(c, v) for c in categories for v in spec.variants(c)]
    fig, axes = plt.subplots(1, len(ways), figsize=(4.2 * len(ways) + 2, 0.22 * len(rows) + 2.2), squeeze=False)
    for ax, way in zip(axes[0], ways):
        cells = grouped([o for o in outcomes if o.way == way], lambda o: (o.clip.category, o.clip.variant,
                                                                          o.clip.condition))
        grid = np.array([[_rate(cells.get((c, v, k), []))[0] for k in spec.CONDITIONS] for c, v in rows])
        # coloured by how wrong the cell is: a missed interruption is as red as a cut backchannel
        wanted = np.array([[c in TAKEOVER_WANTED] for c, _ in rows])
        ax.imshow(np.where(wanted, 1 - grid, grid), vmin=0, vmax=1, cmap="RdYlGn_r", aspect="auto")
        ax.set_xticks(range(len(spec.CONDITIONS)), spec.CONDITIONS, fontsize=7, rotation=30)
        ax.set_yticks(range(len(rows)), [f"{c}: {v}" for c, v in rows] if ax is axes[0][0] else [""] * len(rows),
                      fontsize=6)
        ax.set_title(way, fontsize=9)
        for y in range(grid.shape[0]):
            for x in range(grid.shape[1]):
                if not np.isnan(grid[y, x]):
                    ax.text(x, y, f"{grid[y, x]:.2f}", ha="center", va="center", fontsize=5)
    made_by = "\n".join(textwrap.wrap(f"made by: {command}", width=int(45 * len(ways) + 20),
                                       subsequent_indent="    "))
    fig.suptitle(f"take-over rate by variant x condition (numbers); colour: green right, red wrong\n"
                 f"(interruption, smooth: a take-over is right; the others: wrong)\n{FLOOR_NOTE}\n{made_by}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)

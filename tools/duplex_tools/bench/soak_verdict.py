"""The verdicts of `duplex bench soak`, from its samples alone (so they can be checked on made-up
series). Three moments per resource: the idle server after warm-up ("warmed"), the most seen
while the rest of the calls ran, and the idle server after every call hung up ("final").

- resident memory (all of the server, and each of its processes): the most after warm-up may
  exceed the warmed value by at most ``rss_mib`` MiB or ``rss_pct`` % of it, whichever is more
  (a leak of 20 KiB per barge-in shows as 20 MiB over 1,000 of them);
- open fds, threads, /dev/shm segments: back at idle to no more than at idle after warm-up
  (both idle, so the calls' own sockets and buffers are not counted against either);
- what each stage holds (live requests, KV slots, feedback rows, relay blocks, queues): nothing
  at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RSS_GROWTH_MIB = 20.0
RSS_GROWTH_PCT = 10.0
COUNTED = ("fds", "threads", "shm_segments")


@dataclass(frozen=True)
class Bounds:
    rss_mib: float = RSS_GROWTH_MIB
    rss_pct: float = RSS_GROWTH_PCT


def resource_rows(samples: list[dict], bounds: Bounds = Bounds()) -> list[dict]:
    """One row per resource: at warm-up, most after, final, growth, and pass or FAIL."""
    warmed = _one(samples, "warmed")
    final = _one(samples, "final")
    after = [s for s in samples if s["phase"] == "run"]
    if warmed is None or final is None or not after:
        return [{"resource": "samples", "verdict": "FAIL",
                 "rule": "an idle sample after warm-up, samples while the calls ran, and one at the end",
                 "at_warmup": None, "max_after": None, "final": None, "growth": None}]
    rows = [_rss_row("RSS total (MiB)", [s["rss_mib"] for s in after], warmed["rss_mib"], final["rss_mib"], bounds)]
    for group in warmed["rss_by_process"]:
        series = [s["rss_by_process"].get(group, 0.0) for s in after]
        rows.append(_rss_row(f"RSS {group} (MiB)", series, warmed["rss_by_process"][group],
                             final["rss_by_process"].get(group, 0.0), bounds))
    for key in COUNTED:
        rows.append(_back_row(key, [s[key] for s in after], warmed[key], final[key]))
    for stage in warmed["held"]:
        rows.append(_empty_row(stage, [s["held"].get(stage, 0) for s in after], warmed["held"][stage],
                               final["held"].get(stage, 0), final.get("held_detail", {}).get(stage, {})))
    return rows


def passed(rows: list[dict]) -> bool:
    return bool(rows) and all(r["verdict"] == "pass" for r in rows)


def rss_slope_kib(samples: list[dict]) -> float | None:
    """The least-squares slope of total RSS against barge-ins made, after warm-up (KiB each):
    a leak's size per barge-in, whatever the bounds say."""
    after = [s for s in samples if s["phase"] == "run"]
    x = np.array([s["barge_ins"] for s in after], dtype=np.float64)
    if len(after) < 3 or np.ptp(x) == 0:
        return None
    y = np.array([s["rss_mib"] for s in after], dtype=np.float64)
    return round(float(np.polyfit(x, y, 1)[0]) * 1024, 3)


def _one(samples: list[dict], phase: str) -> dict | None:
    found = [s for s in samples if s["phase"] == phase]
    return found[-1] if found else None


def _rss_row(name: str, after: list[float], warmed: float, final: float, bounds: Bounds) -> dict:
    most = max(after)
    growth = most - warmed
    limit = max(bounds.rss_mib, warmed * bounds.rss_pct / 100)
    return {"resource": name, "at_warmup": round(warmed, 1), "max_after": round(most, 1), "final": round(final, 1),
            "growth": round(growth, 1), "growth_pct": round(100 * growth / warmed, 2) if warmed else None,
            "verdict": "pass" if growth <= limit else "FAIL",
            "rule": f"max after warm-up - warmed <= {limit:.1f} MiB (max of {bounds.rss_mib:g} MiB, "
                    f"{bounds.rss_pct:g} %)"}


def _back_row(name: str, after: list[int], warmed: int, final: int) -> dict:
    return {"resource": name, "at_warmup": warmed, "max_after": max(after), "final": final,
            "growth": final - warmed, "verdict": "pass" if final <= warmed else "FAIL",
            "rule": "final (idle) <= warmed (idle)"}


def _empty_row(stage: str, after: list[int], warmed: int, final: int, detail: dict[str, int]) -> dict:
    return {"resource": f"{stage} held", "at_warmup": warmed, "max_after": max(after), "final": final,
            "growth": final - warmed, "verdict": "pass" if final == 0 else "FAIL",
            "rule": "final == 0 (live requests, KV slots, feedback rows, relay blocks, queues)"
                    + (f"; still held: {detail}" if detail else "")}

"""Two checkouts benched in alternating runs (before, after, before, after, ...): time to first
audio and barge-in stop from `duplex bench load`, the 1 MiB stage hop from `duplex bench relay`.
Prints each figure's median per side, their ratio and whether it is within the bound; writes the
raw runs (--json) and a plot (--plot: the runs as dots, the median as a bar).

    git worktree add ../duplex-before eb33b7b
    python scripts/bench_pair.py --before ../duplex-before --after . \
        --json docs/benchmarks/house-before-after.json --plot docs/benchmarks/house-before-after.png

Both sides run with this interpreter (the project's venv, scripts/setup.sh --test): each side's
`duplex` and `duplex_tools` are put first on PYTHONPATH, and the run checks they were the ones
imported. Exit 1 when a median moved by more than the bound."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOAD = ["bench", "load", "--serve", "toy-voice", "--sessions", "4", "--rounds", "2", "--plot", ""]
RELAY = ["bench", "relay", "--sizes", "1MiB", "--iterations", "300"]
METRICS = {  # name -> (label, unit)
    "ttfb_p50_ms": ("time to first audio p50", "ms"),
    "stop_p50_ms": ("barge-in stop p50", "ms"),
    "hop_1mib_p50_ms": ("stage hop 1 MiB p50", "ms"),
}


def side_env(checkout: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(checkout / "tools")])
    return env


def check_side(checkout: Path) -> dict[str, str]:
    """The side's commit; refused when its `duplex` or `duplex_tools` is imported from elsewhere."""
    code = "import duplex, duplex_tools; print(duplex.__file__); print(duplex_tools.__file__)"
    files = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=side_env(checkout),
                           capture_output=True, text=True, check=True).stdout.split()
    for file in files:
        if not Path(file).resolve().is_relative_to(checkout):
            raise SystemExit(f"{checkout}: imports {file}, not its own code")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True,
                            check=True).stdout.strip()
    return {"commit": commit}


def duplex(checkout: Path, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "duplex.cli", *args, "--json", str(out)]
    done = subprocess.run(cmd, cwd=checkout, env=side_env(checkout), capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
        raise SystemExit(f"{checkout}: duplex {' '.join(args)} exited {done.returncode}")
    return json.loads(out.read_text())


def one_run(checkout: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        load = duplex(checkout, LOAD, Path(tmp) / "load.json")["levels"][0]
        relay = duplex(checkout, RELAY, Path(tmp) / "relay.json")
    hop = relay["sizes"][0]
    return {
        "ttfb_p50_ms": load["ttfb_ms"]["p50"], "stop_p50_ms": load["stop_ms"]["p50"],
        "hop_1mib_p50_ms": hop["hop_p50_ms"],
        "ttfb_p95_ms": load["ttfb_ms"]["p95"], "stop_p95_ms": load["stop_ms"]["p95"],
        "hop_1mib_p99_ms": hop["hop_p99_ms"], "ttfb_n": load["ttfb_ms"]["n"], "stop_n": load["stop_ms"]["n"],
        "calls_ok": f"{load['calls_ok']}/{load['calls']}", "machine_busy_cores": load["machine_busy_cores"],
    }


def summary(runs: dict[str, list[dict]], bound: float) -> list[dict]:
    rows = []
    for name, (label, unit) in METRICS.items():
        before = statistics.median(r[name] for r in runs["before"])
        after = statistics.median(r[name] for r in runs["after"])
        ratio = after / before
        rows.append({"metric": name, "label": label, "unit": unit, "before_median": before,
                     "after_median": after, "ratio": ratio, "within": abs(ratio - 1) <= bound})
    return rows


def plot(path: Path, runs: dict[str, list[dict]], rows: list[dict], command: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4))
    for ax, row in zip(axes, rows, strict=True):
        for x, side in enumerate(("before", "after")):
            values = [r[row["metric"]] for r in runs[side]]
            ax.scatter([x] * len(values), values, color="C0" if side == "before" else "C1", zorder=3)
            median = row[f"{side}_median"]
            ax.hlines(median, x - 0.25, x + 0.25, color="black")
            ax.annotate(f"{median:.3g}", (x + 0.27, median), va="center", fontsize=8)
        ax.set_xticks([0, 1], ["before", "after"])
        ax.set_xlim(-0.6, 1.8)
        ax.set_ylim(0, 1.15 * max(r[row["metric"]] for side in runs.values() for r in side))
        ok = "within" if row["within"] else "outside"
        ax.set_title(f"{row['label']}\nafter/before {row['ratio']:.2f} ({ok} bound)", fontsize=9)
        ax.set_ylabel(row["unit"])
    fig.suptitle(f"dots: runs, bars: medians. {command}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the earlier commit")
    parser.add_argument("--after", type=Path, required=True, help="checkout of the later commit")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--bound", type=float, default=0.10, help="largest allowed |after/before - 1|")
    parser.add_argument("--json", dest="json_path", type=Path, help="write the runs and medians here")
    parser.add_argument("--plot", type=Path, help="PNG of the runs and medians")
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    info = {side: check_side(path) for side, path in sides.items()}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.runs):
        for side, path in sides.items():
            runs[side].append(one_run(path))
            r = runs[side][-1]
            print(f"run {i + 1} {side}: TTFB p50 {r['ttfb_p50_ms']:.0f} ms, stop p50 {r['stop_p50_ms']:.0f} ms, "
                  f"hop p50 {r['hop_1mib_p50_ms']:.3f} ms", flush=True)
    rows = summary(runs, args.bound)
    print("| metric | before median | after median | after/before | within bound |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['label']} ({row['unit']}) | {row['before_median']:.3f} | {row['after_median']:.3f} "
              f"| {row['ratio']:.3f} | {'yes' if row['within'] else 'no'} |")
    command = (f"python scripts/bench_pair.py --before <checkout of {info['before']['commit'][:7]}> "
               f"--after <checkout of {info['after']['commit'][:7]}> --runs {args.runs}")
    if args.json_path:
        args.json_path.write_text(json.dumps({
            "command": command, "load": shlex.join(["duplex", *LOAD]), "relay": shlex.join(["duplex", *RELAY]),
            "bound": args.bound, "sides": info, "runs": runs, "medians": rows}, indent=2) + "\n")
    if args.plot:
        plot(args.plot, runs, rows, command)
    return 0 if all(row["within"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""summary.md of a device check (scripts/gpu_check.sh): its steps, the probe, the GPU tests and
the pipeline bench against the targets. Reads what the steps left in OUT; a step that failed or
timed out shows as such, the others still report.

    python scripts/gpu_summary.py OUT
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# (what, level, mode, key, limit): time to first audio and throughput targets on one H200.
TARGETS = [("TTFA p50 at 1 < 200 ms", "1", "ttfa_p50_ms", 200.0), ("TTFA p95 at 1 < 200 ms", "1", "ttfa_p95_ms", 200.0),
           ("TTFA p50 at 8 < 300 ms", "8", "ttfa_p50_ms", 300.0), ("TTFA p95 at 8 < 400 ms", "8", "ttfa_p95_ms", 400.0),
           ("TTFA p95 at 16 < 700 ms", "16", "ttfa_p95_ms", 700.0)]


def _steps(out: Path) -> list[str]:
    path = out / "steps.txt"
    if not path.exists():
        return ["(no steps.txt)"]
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [f"| {r[0]} | {r[1]}{' (timed out)' if r[1] in ('124', '137') else ''} | {r[2]} |" for r in rows]


def _tests(out: Path) -> list[str]:
    path = out / "tests.xml"
    if not path.exists():
        return ["no test report (the step failed before pytest wrote one)"]
    lines = []
    for case in ET.parse(path).getroot().iter("testcase"):
        verdict = "passed"
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                verdict = f"{kind}: {(node.get('message') or '')[:300]}"
        lines.append(f"- `{case.get('classname')}.{case.get('name')}` ({float(case.get('time', 0)):.1f} s): {verdict}")
        for prop in case.iter("property"):
            lines.append(f"  - {prop.get('name')}: `{prop.get('value')}`")
    return lines


def _printed(out: Path) -> list[str]:
    """Figures the GPU tests printed (lines with a number and a unit) between the tests' markers."""
    path = out / "log.txt"
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    start, end = text.find("== ["), text.rfind("tests: rc")
    section = text[text.find("tests (timeout", start):end] if "tests (timeout" in text else ""
    keep = [line.strip() for line in section.splitlines()
            if re.search(r"\d\s*(ms|MiB|GiB|GB/s|s\b)|p50|REAL_SIZE", line) and not line.startswith("==")]
    return [f"    {line[:400]}" for line in keep[:40]]


def _bench(out: Path) -> list[str]:
    path = out / "results.json"
    if not path.exists():
        return ["no bench results (see log.txt)"]
    results = json.loads(path.read_text())
    lines = [f"config {results.get('config')} on {results.get('accelerator', '?')}, "
             f"devices {results.get('devices')}", ""]
    if results.get("partial"):
        lines.append("PARTIAL: the staged run ended, the fused baseline did not.")
    staged, fused = results.get("staged", {}), results.get("fused") or {}
    lines += ["| conc | staged TTFA p50 | p95 | fused TTFA p50 | p95 | staged audio s/s | fused audio s/s |",
              "|---|---|---|---|---|---|---|"]
    for level in results.get("concurrency", []):
        s, f = staged.get(str(level), {}), fused.get(str(level), {})
        cell = lambda d, k, fmt="{:.0f}": fmt.format(d[k]) if k in d else "-"
        lines.append(f"| {level} | {cell(s, 'ttfa_p50_ms')} | {cell(s, 'ttfa_p95_ms')} | {cell(f, 'ttfa_p50_ms')} | "
                     f"{cell(f, 'ttfa_p95_ms')} | {cell(s, 'throughput_audio_s_per_s', '{:.2f}')} | "
                     f"{cell(f, 'throughput_audio_s_per_s', '{:.2f}')} |")
    lines += ["", "targets:"]
    for what, level, key, limit in TARGETS:
        value = staged.get(level, {}).get(key)
        if value is not None:
            lines.append(f"- {what}: {value:.0f} ms -> {'met' if value < limit else 'NOT met'}")
    for level in ("8", "16"):
        s, f = staged.get(level), fused.get(level)
        if s and f:
            p95 = s["ttfa_p95_ms"] < f["ttfa_p95_ms"]
            thru = s["throughput_audio_s_per_s"] > f["throughput_audio_s_per_s"]
            lines.append(f"- staged beats fused at {level}: p95 TTFA {'yes' if p95 else 'NO'}, "
                         f"audio s/s {'yes' if thru else 'NO'}")
    aborts = results.get("aborts") or {}
    if aborts:
        lines.append(f"- abort -> every stage empty: p50 {aborts['p50_ms']:.1f} ms, p95 {aborts['p95_ms']:.1f} ms, "
                     f"max {aborts['max_ms']:.1f} ms ({len(aborts['trials'])} trials; target <= 50 ms)")
    overhead = results.get("overhead_c1") or {}
    if overhead.get("turns"):
        lines.append(f"- critical path at 1: compute {overhead['critical_compute_ms']:.1f} ms, staged TTFA "
                     f"{overhead['staged_ms']:.1f} ms; compute by stage (ms): "
                     + ", ".join(f"{k} {v:.1f}" for k, v in overhead["compute_ms"].items()))
    return lines


def main(out: Path) -> int:
    parts = ["# Device check", "", "| step | rc | seconds |", "|---|---|---|", *_steps(out), ""]
    probe = out / "probe.json"
    if probe.exists():
        parts += ["## Probe", "", "```", probe.read_text().strip()[:3000], "```", ""]
    parts += ["## GPU tests", "", *_tests(out), "", "printed by the tests:", "", *_printed(out), ""]
    parts += ["## Pipeline bench", "", *_bench(out), ""]
    text = "\n".join(parts)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

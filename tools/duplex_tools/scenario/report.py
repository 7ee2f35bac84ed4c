"""Scenario results as a terminal table, a Markdown summary and JSON."""

from __future__ import annotations

from pathlib import Path

from duplex_tools.report import percentile, table
from duplex_tools.scenario.measure import ScenarioResult

HEADERS = ["scenario", "result", "TTFB ms (each)", "barge-in stop ms", "abort freed ms", "false int.",
           "take-overs", "longest gap in a reply ms", "failures"]


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values) if values else "-"


def rows(results: list[ScenarioResult]) -> list[list[str]]:
    out = []
    for r in results:
        freed = [s.freed_after_ms for s in r.steps if s.freed_after_ms is not None]
        gaps = [s.reply_gap_ms for s in r.steps if s.reply_gap_ms is not None]
        out.append([r.name, r.status, _ms(r.ttfb_ms), _ms(r.stop_ms), _ms(freed), str(r.false_interruptions),
                    str(r.take_overs), _ms([max(gaps)] if gaps else []), _first(r.failures)])
    return out


def _first(failures: list[str]) -> str:
    if not failures:
        return "-"
    return failures[0][:100] + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")


def totals(results: list[ScenarioResult]) -> dict:
    ttfb = [v for r in results for v in r.ttfb_ms]
    stop = [v for r in results for v in r.stop_ms]
    return {
        "scenarios": len(results), "passed": sum(r.passed for r in results),
        "known_issues": sum(r.status == "known issue" for r in results),
        "ttfb_ms": _spread(ttfb), "stop_ms": _spread(stop),
        "false_interruptions": sum(r.false_interruptions for r in results),
        "take_overs": sum(r.take_overs for r in results),
    }


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values, default=None)}


def render_table(results: list[ScenarioResult]) -> str:
    t = totals(results)
    summary = (f"{t['passed']}/{t['scenarios']} scenarios passed ({t['known_issues']} known issue(s) failed as "
               f"marked); TTFB p50 {t['ttfb_ms']['p50']:.0f} ms "
               f"p95 {t['ttfb_ms']['p95']:.0f} ms (n={t['ttfb_ms']['n']}); barge-in stop p50 "
               f"{t['stop_ms']['p50']:.0f} ms p95 {t['stop_ms']['p95']:.0f} ms (n={t['stop_ms']['n']}); "
               f"false interruptions {t['false_interruptions']}; take-overs {t['take_overs']}")
    return table(HEADERS, rows(results)) + "\n\n" + summary


def render_markdown(results: list[ScenarioResult], url: str, command: str) -> str:
    lines = ["# Scenario results", "", f"Server: `{url}`  ", f"Command: `{command}`", "",
             render_table(results), ""]
    for r in results:
        lines += [f"## {r.name}: {r.status}", "", r.description.strip(), ""]
        if r.known_issue:
            lines += [f"Known issue: {r.known_issue.strip()}", ""]
        if r.plot:
            lines += [f"![{r.name} timeline]({Path(r.plot).name})", ""]
        for step in r.steps:
            marks = [f"{c.name} {'ok' if c.ok else 'FAILED'} ({c.detail})" for c in step.checks]
            lines.append(f"- step {step.index + 1} `{step.kind}` {step.title!r}: "
                         + ("; ".join(marks) or "measured only"))
        verdicts = [f"{c.name} {'ok' if c.ok else 'FAILED'}" + (f" ({c.detail})" if c.detail else "") for c in r.checks]
        lines += ["- scenario: " + "; ".join(verdicts), ""]
    return "\n".join(lines)

"""`duplex bench services`'s report: every pipeline at every caller count in the table, and the
PNG drawn from the same results (the numbers here are made up; the bench measures them)."""

from __future__ import annotations

from pathlib import Path

from duplex_tools.bench.services import render
from duplex_tools.bench.services_plot import plot_services


def _measured(p50: float, cpu: float) -> dict:
    summary = {"p50": p50, "p95": p50 * 1.2, "turns": 3, "turns_with_audio": 3}
    return {"summary": {"off": summary, "on": {**summary, "p50": p50 - 100}},
            "duplex_cpu_s_per_turn": cpu, "servers_cpu_s_per_turn": 1.0 - cpu}


def _results() -> dict:
    runs = {str(n): {"callers": n, "pipelines": {"in process": _measured(800.0 * n, 1.2),
                                                  "speech servers (duplex asr)": _measured(850.0 * n, 0.5)}}
            for n in (1, 8)}
    return {"cpus": 2, "runs": runs, "engine": None}


def test_the_table_has_each_pipeline_and_mode_at_each_caller_count():
    text = render(_results())
    for callers in (1, 8):
        assert f"{callers} caller(s) at once" in text
    rows = [line for line in text.splitlines() if "preemption" in line]
    assert len(rows) == 2 * 2 * 2  # counts x pipelines x modes
    assert any("speech servers (duplex asr), preemption on" in row and "6700" in row for row in rows)


def test_the_png_is_drawn_and_names_its_command(tmp_path: Path):
    path = plot_services(_results(), tmp_path / "services.png", "duplex bench services --callers 1 8")
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

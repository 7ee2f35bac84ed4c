"""Tables, percentiles and JSON output shared by the benchmarks and the scenario runner."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "-|-".join("-" * w for w in widths)
    body = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(["| " + line + " |", "|-" + sep + "-|", *("| " + b + " |" for b in body)])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2))
        print(f"wrote {path}")

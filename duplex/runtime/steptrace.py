"""Optional step tracing: when and for which requests each scheduler step computed.

Off unless ``DUPLEX_STEP_TRACE`` names a folder (stage processes inherit it at spawn). Each
scheduler then appends one JSON line per step to ``<folder>/<stage>-<pid>.jsonl``:
``{"stage", "rids", "t0", "t1", ...}`` with ``time.monotonic()`` times, which are system-wide on
Linux, so spans from different processes line up. ``duplex bench pipeline`` reads them to split
time to first audio into per-stage compute and the runtime's share (hops, waits).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from duplex.runtime.step_stats import StepTimes

ENV = "DUPLEX_STEP_TRACE"


class StepTrace:
    def __init__(self, stage: str, times: StepTimes | None = None) -> None:
        folder = os.environ.get(ENV)
        self._stage = stage
        self._times = times  # always-on step histogram (the stage's stats), traced or not
        self._file = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            # held open across steps (line-buffered appends) until close(); no single block to scope it to
            self._file = open(Path(folder) / f"{stage}-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, rids: Iterable[str], t0: float, t1: float, **extra) -> None:
        if self._times is not None:
            self._times.observe(t1 - t0)
        if self._file is not None:
            self._file.write(json.dumps({"stage": self._stage, "rids": list(rids), "t0": t0, "t1": t1, **extra}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_spans(folder: str | Path) -> list[dict]:
    spans = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans

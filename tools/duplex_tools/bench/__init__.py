"""Benchmarks: each prints a table of numbers measured side by side in one run."""

from __future__ import annotations

import sys


def overrides_refused(overrides: list[str], serve: str | None) -> bool:
    """Arguments after a bench's own options go to the ``duplex serve`` it starts (dotted pipeline
    overrides, ``--media-workers 2``): without ``--serve`` they would change nothing, so it says so."""
    if overrides and not serve:
        print(f"error: overrides ({' '.join(overrides)}) change a pipeline served with --serve, not --url",
              file=sys.stderr)
        return True
    return False

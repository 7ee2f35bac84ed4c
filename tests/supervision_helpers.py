"""Stage builders for the supervision tests (imported by the spawned stage processes by name):
one that refuses to start while a flag file exists, one whose step keeps the GIL busy."""

from __future__ import annotations

import os
import time
from typing import Any

from duplex.runtime.contract import BuildContext, WorkItem


def build_flaky(ctx: BuildContext):
    """Upper-cases text; fails to build (the process exits while starting) while
    ``args['fail_if']`` exists."""
    if os.path.exists(ctx.args["fail_if"]):
        raise RuntimeError(f"refusing to start: {ctx.args['fail_if']} exists")

    def upper(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [[{"text": str(item.data["text"]).upper()}] if item.data is not None else [] for item in items]

    return upper


def build_busy(ctx: BuildContext):
    """A long model step in pure Python (it holds the GIL between bytecode switches, unlike a
    sleep): ``busy_s`` seconds of spinning per step, then the text upper-cased."""
    busy_s = float(ctx.args["busy_s"])

    def busy(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        end = time.monotonic() + busy_s
        spins = 0
        while time.monotonic() < end:
            spins += 1
        return [[{"text": str(item.data["text"]).upper(), "spins": spins}] if item.data is not None else []
                for item in items]

    return busy


BUILDERS = {"test.flaky": build_flaky, "test.busy": build_busy}

"""Shared by the runtime tests: toy pipelines and bounded waiting on observable state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from duplex.config import pipeline_from_dict
from duplex.models.registry import BUILDERS
from duplex.runtime.coordinator import Coordinator


def toy_pipeline(stages: list[dict], **extra) -> dict:
    return {"name": "test", "stages": [{"memory": 0.01, **s} for s in stages], **extra}


def coordinator(stages: list[dict], **extra) -> Coordinator:
    return Coordinator(pipeline_from_dict(toy_pipeline(stages, **extra)), BUILDERS)


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"):
    """Poll an observable condition (stats, status) until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


async def stage_holds(coord: Coordinator, stage: str, request_id: str, resource: str | None = None) -> bool:
    view = (await coord.stats())[stage]
    if resource is not None:
        return view.resources.get(resource, 0) > 0 and request_id in view.request_ids
    return request_id in view.request_ids

"""Scheduler kinds by name: the one place that maps a config's ``kind`` to a class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from duplex.config.pipeline import StageConfig
from duplex.runtime.scheduler import Scheduler
from duplex.runtime.schedulers.ar import ARScheduler, FeedbackARScheduler
from duplex.runtime.schedulers.simple import SimpleScheduler
from duplex.runtime.schedulers.stream import StreamScheduler

SCHEDULERS: dict[str, Callable[[StageConfig, Any], Scheduler]] = {
    "simple": SimpleScheduler,
    "ar": ARScheduler,
    "feedback_ar": FeedbackARScheduler,
    "stream": StreamScheduler,
}


def make_scheduler(stage: StageConfig, computation: object) -> Scheduler:
    return SCHEDULERS[stage.scheduler.kind](stage, computation)

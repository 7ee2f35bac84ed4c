"""The end-of-turn model the server lends its sessions (``turn_detection: semantic_vad``).

Loading it takes seconds (onnxruntime, the Whisper feature extractor), so a server loads it only
once a session wants it: at start when the pipeline's sessions default to ``semantic_vad``, else
when a session first switches to it (``prepare``). Until it is loaded a judgement waits for it."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from duplex.models.smart_turn import SmartTurn, SmartTurnUnavailable, smart_turn_path

log = logging.getLogger("duplex.server")


class LazyTurnEnd:
    def __init__(self) -> None:
        self._loading: asyncio.Future[SmartTurn] | None = None

    def prepare(self) -> None:
        """Start loading (on a worker thread) if nothing has; returns at once."""
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(SmartTurn))

    async def model(self) -> SmartTurn:
        """The loaded model (loading it first if nothing has)."""
        self.prepare()
        assert self._loading is not None
        return await asyncio.shield(self._loading)

    async def complete_probability(self, audio: np.ndarray) -> float:
        return await (await self.model()).complete_probability(audio)

    def close(self) -> None:
        if self._loading is not None and self._loading.done() and not self._loading.exception():
            self._loading.result().close()


def load_turn_end_model(eager: bool, locate: Callable[[], Path] = smart_turn_path) -> LazyTurnEnd | None:
    """Smart Turn where its wheel is installed (``eager``: the pipeline's sessions judge turns by
    default, start loading now); None (semantic turns judge by words only, and say so in
    ``session.created``) where it is not. ``locate`` finds the model file."""
    try:
        locate()
        if importlib.util.find_spec("onnxruntime") is None:
            raise SmartTurnUnavailable("semantic end of turn needs onnxruntime (scripts/setup.sh --local)")
    except SmartTurnUnavailable as exc:
        if eager:
            log.warning("no end-of-turn audio model (Smart Turn): this pipeline's sessions end turns by meaning "
                        "(semantic_vad) and will judge them by their words only, ending fewer turns early and "
                        "waiting out more pauses: %s", exc)
        else:
            log.warning("no end-of-turn audio model (Smart Turn): sessions that ask for semantic_vad will judge "
                        "turns by their words only: %s", exc)
        return None
    model = LazyTurnEnd()
    if eager:
        model.prepare()
    return model

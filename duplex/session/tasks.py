"""The tasks one session runs (a consumer per response): started, logged if they crash, and
cancelled together when the session closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("duplex.session")


class SessionTasks:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.start(coro)

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        """``spawn``, keeping the task (to cancel it before the session ends)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._log_crash)
        return task

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _log_crash(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug here, not the runtime's failure
            log.error("session %s: task crashed", self.owner, exc_info=task.exception())

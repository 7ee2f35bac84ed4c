"""Requests that ended recently, remembered so a late message for one is dropped, not revived.

Every layer that forgets a request meets its stragglers: inputs still in flight to a stage that
finished it, outputs of a step that ran while it was aborted, a restarted stage told which
requests are over, a client reusing an id. Each keeps one ``EndedRequests``: bounded, oldest
forgotten first, with an optional outcome per id (the coordinator's final status).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

# A straggler arrives within seconds of its request's end (a hop, a step, a restart). 20000 ids
# cover minutes even at a hundred requests ending per second, and cost ~2 MB per memory.
ENDED_MEMORY = 20000

Outcome = TypeVar("Outcome")


class EndedRequests(Generic[Outcome]):
    def __init__(self, request_ids: Iterable[str] = (), limit: int = ENDED_MEMORY) -> None:
        self._limit = limit
        self._ended: OrderedDict[str, Outcome | None] = OrderedDict()
        for request_id in request_ids:
            self.add(request_id)

    def add(self, request_id: str, outcome: Outcome | None = None) -> None:
        """Remember (again: it becomes the newest) that ``request_id`` ended."""
        self._ended[request_id] = outcome
        self._ended.move_to_end(request_id)
        while len(self._ended) > self._limit:
            self._ended.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ended

    def outcome(self, request_id: str) -> Outcome | None:
        return self._ended.get(request_id)

    def items(self) -> Iterator[tuple[str, Outcome | None]]:
        """Oldest first."""
        return iter(list(self._ended.items()))

    def __len__(self) -> int:
        return len(self._ended)

"""One stage's bookkeeping, free of sockets: input order, fan-in, end of input, output routes.

The host feeds ``accept`` with each arriving item and forwards the returned ``WorkItem``s to
the scheduler; it asks ``routes`` where an ``Emit`` goes. Nothing here branches on the
scheduler's kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duplex.config.pipeline import PipelineConfig, StageConfig
from duplex.runtime.contract import Emit, OverlapProbe, Payload, Request, WorkItem
from duplex.runtime.ended import EndedRequests

COORDINATOR = "coordinator"


@dataclass
class _RequestInputs:
    params: Request | None = None
    next_seq: dict[str, int] = field(default_factory=dict)
    early: dict[str, dict[int, tuple[Any, bool]]] = field(default_factory=dict)  # out of order
    ended: set[str] = field(default_factory=set)
    gathered: dict[str, Any] = field(default_factory=dict)  # wait_for sources' final data
    delivered_eos: bool = False


@dataclass(frozen=True)
class Route:
    dst: str
    data: Any
    eos: bool


class StageShell:
    def __init__(self, stage: StageConfig, pipeline: PipelineConfig) -> None:
        self.stage = stage
        self.name = stage.name
        self.sources = pipeline.upstreams(stage.name)
        self._wait_for = set(stage.wait_for)
        self._requests: dict[str, _RequestInputs] = {}
        self._out_seq: dict[tuple[str, str], int] = {}
        self._finished: EndedRequests[None] = EndedRequests()  # so late inputs for it are dropped

    # -- inputs -------------------------------------------------------------------------------
    def knows(self, request_id: str) -> bool:
        return request_id in self._requests

    def accept(self, request_id: str, src: str, seq: int, data: Any, eos: bool,
               params: Request | None) -> list[WorkItem]:
        """Take one arriving item; return the work that is now ready, in order."""
        if src not in self.sources:
            raise ValueError(f"stage {self.name} got input from {src!r}, not one of {self.sources}")
        req = self._requests.setdefault(request_id, _RequestInputs())
        if params is not None:
            req.params = params
        expected = req.next_seq.get(src, 0)
        if seq < expected or src in req.ended:
            return []  # duplicate
        req.early.setdefault(src, {})[seq] = (data, eos)
        ready: list[WorkItem] = []
        pending = req.early[src]
        while expected in pending:
            item_data, item_eos = pending.pop(expected)
            expected += 1
            ready.extend(self._take(request_id, req, src, item_data, item_eos))
        req.next_seq[src] = expected
        return ready

    def _take(self, request_id: str, req: _RequestInputs, src: str, data: Any, eos: bool) -> list[WorkItem]:
        if eos:
            req.ended.add(src)
        all_ended = req.ended.issuperset(self.sources)
        if src in self._wait_for:
            if eos:
                req.gathered[src] = data
            if not req.ended.issuperset(self._wait_for):
                return []
            merged = req.gathered if len(self._wait_for) > 1 else req.gathered[src]
            return [self._item(request_id, req, "+".join(sorted(self._wait_for)), merged, all_ended)]
        if data is None and not eos:
            return []
        if data is None and eos and not all_ended:
            return []  # a stream ended with a bare marker while other sources still run
        return [self._item(request_id, req, src, data, all_ended)]

    def _item(self, request_id: str, req: _RequestInputs, src: str, data: Any, eos: bool) -> WorkItem:
        req.delivered_eos = req.delivered_eos or eos
        if req.params is None:  # no upstream said (a producer that no longer knew the request)
            return WorkItem(request_id=request_id, source=src, data=data, eos=eos)
        return WorkItem(request_id=request_id, source=src, data=data, eos=eos, params=req.params)

    def params(self, request_id: str) -> Request | None:
        req = self._requests.get(request_id)
        return req.params if req else None

    # -- outputs ------------------------------------------------------------------------------
    def routes(self, emit: Emit) -> list[Route]:
        routes: list[Route] = []
        if not isinstance(self.params(emit.request_id), OverlapProbe):  # a probe goes no further
            routes += [Route(dst, emit.data, emit.eos) for dst in self.stage.stream_to]
            if emit.eos:
                routes += [Route(dst, emit.data, True) for dst in self.stage.next]
        if self.stage.terminal:
            routes.append(Route(COORDINATOR, self._for_client(emit.data), emit.eos))
        return routes

    def _for_client(self, data: Any) -> Any:
        """A payload goes to the client as its ``for_client()`` view (a family's struct may carry
        tensors for the next stage that the client does not need); with ``terminal_keys``, the
        client gets only those keys of a dict output."""
        if isinstance(data, Payload):
            return data.for_client()
        keys = self.stage.terminal_keys
        if keys is None or not isinstance(data, dict):
            return data
        kept = {k: v for k, v in data.items() if k in keys}
        return kept or None

    def next_out_seq(self, request_id: str, dst: str) -> int:
        key = (request_id, dst)
        seq = self._out_seq.get(key, 0)
        self._out_seq[key] = seq + 1
        return seq

    # -- lifetime -----------------------------------------------------------------------------
    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        for key in [k for k in self._out_seq if k[0] == request_id]:
            del self._out_seq[key]

    def finish(self, request_id: str) -> None:
        """The stage emitted its last output: forget the request, drop anything late for it."""
        self.forget(request_id)
        self._finished.add(request_id)

    def finished(self, request_id: str) -> bool:
        return request_id in self._finished

    def request_ids(self) -> set[str]:
        return set(self._requests)

    def buffered_items(self) -> int:
        return sum(
            sum(len(items) for items in req.early.values()) + len(req.gathered)
            for req in self._requests.values()
        )

"""The ``simple`` scheduler keeps a request's items in order even when ``batch_key`` holds one of
them back: a later item of the same request may not join a batch ahead of it (code2wav, whose
batch key is the chunk length, saw "chunk starts at frame 14, expected 8" under 8 concurrent turns)."""

from __future__ import annotations

from duplex.config.pipeline import StageConfig
from duplex.runtime.contract import WorkItem
from duplex.runtime.schedulers.simple import SimpleScheduler
from tests.local_helpers import collect


class KeyedEcho:
    """Echoes each item's text; rows of one batch share the text's length (its ``batch_key``)."""

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[str]]:
        return [[item.data] for item in items]

    def batch_key(self, item: WorkItem) -> int:
        return len(item.data)


def test_an_item_held_back_by_the_batch_key_keeps_its_requests_later_items_behind_it():
    stage = StageConfig(name="keyed", builder="none", scheduler={"kind": "simple", "max_batch_size": 4})
    scheduler = SimpleScheduler(stage, KeyedEcho())
    # b's item opens a batch of length-2 rows; a's first item (length 5) cannot join it, a's
    # second (length 2) could: it must wait for the first
    for item in (WorkItem("b", "client", "b1", True), WorkItem("a", "client", "a-one", False),
                 WorkItem("a", "client", "a2", True)):
        scheduler.inbox.put(item)
    scheduler.start()
    try:
        emits = collect(scheduler, {"a", "b"}, timeout=10)
    finally:
        scheduler.stop()
    assert [e.data for e in emits["a"] if e.data is not None] == ["a-one", "a2"]
    assert [e.data for e in emits["b"] if e.data is not None] == ["b1"]

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


class Recorder:
    """Echoes each item and records which requests each batch held."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[str]]:
        self.batches.append([item.request_id for item in items])
        return [[item.data] for item in items]


def test_requests_take_turns_so_one_backlog_cannot_starve_a_new_requests_first_item():
    stage = StageConfig(name="fair", builder="none", scheduler={"kind": "simple", "max_batch_size": 2})
    recorder = Recorder()
    scheduler = SimpleScheduler(stage, recorder)
    # two replies' words all queued at once (as a thinker emits them), then a third reply's first word
    for rid in ("a", "b"):
        for n in range(6):
            scheduler.inbox.put(WorkItem(rid, "client", f"{rid}{n}", n == 5))
    scheduler.inbox.put(WorkItem("c", "client", "c0", False))
    scheduler.inbox.put(WorkItem("c", "client", "c1", True))
    scheduler.start()
    try:
        emits = collect(scheduler, {"a", "b", "c"}, timeout=10)
    finally:
        scheduler.stop()
    assert recorder.batches[0] == ["a", "b"]
    assert "c" in recorder.batches[1]  # not after a's and b's twelve words
    assert all(len(set(batch)) == len(batch) for batch in recorder.batches)
    for rid in ("a", "b"):
        assert [e.data for e in emits[rid] if e.data is not None] == [f"{rid}{n}" for n in range(6)]


def test_a_requests_last_item_goes_first_it_ends_a_turn():
    stage = StageConfig(name="final-first", builder="none", scheduler={"kind": "simple", "max_batch_size": 1})
    recorder = Recorder()
    scheduler = SimpleScheduler(stage, recorder)
    for n in range(3):  # a caller's audio chunks, still speaking
        scheduler.inbox.put(WorkItem("speaking", "client", f"s{n}", False))
    scheduler.inbox.put(WorkItem("ended", "client", "e0", True))  # another caller's turn just ended
    scheduler.inbox.put(WorkItem("speaking", "client", "s3", True))
    scheduler.start()
    try:
        collect(scheduler, {"speaking", "ended"}, timeout=10)
    finally:
        scheduler.stop()
    assert recorder.batches[0] == ["ended"]
    assert recorder.batches[1:] == [["speaking"]] * 4

"""Outputs shipped by the scheduler thread that made them, and progress reports held back off the
hop: order, aborts and relay blocks still hold (real stage processes, sockets and shm)."""

import asyncio
import os
import select
import threading

from duplex.config import pipeline_from_dict
from duplex.models.registry import BUILDERS
from duplex.runtime import messages as m
from duplex.runtime.contract import ErrorCode, StageError, TurnRequest
from duplex.runtime.progress import ProgressBuffer
from duplex.runtime.requests import RequestStatus
from duplex.runtime.scheduler import AbortCommand, Emit, Outbox, WorkItem
from duplex.runtime.stage_host import HostSpec, StageHost
from tests.runtime_helpers import coordinator, stage_holds, toy_pipeline, wait_for


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_outbox_ships_every_emit_in_the_putting_thread_and_signals_a_crash_apart():
    outbox = Outbox()
    shipped: list[tuple[str, int]] = []
    outbox.ship_in_caller(lambda emit: shipped.append((emit.request_id, threading.get_ident())))
    worker = threading.Thread(target=lambda: [outbox.put(Emit("r", i)) for i in range(3)])
    worker.start()
    worker.join()
    assert shipped == [("r", worker.ident)] * 3
    assert not _readable(outbox.wake_fd) and outbox.drain() == [] and outbox.crash is None
    crash = StageError(ErrorCode.STAGE_CRASHED, "scheduler crashed", "a")
    outbox.crashed(crash)
    assert _readable(outbox.wake_fd) and outbox.crash == crash
    assert outbox.drain() == [] and len(shipped) == 3
    outbox.close()


def test_without_a_shipper_emits_queue_for_the_driver_and_wake_it():
    outbox = Outbox()
    outbox.put(Emit("r", 1))
    assert _readable(outbox.wake_fd)
    assert [(e.request_id, e.data) for e in outbox.drain()] == [("r", 1)] and not _readable(outbox.wake_fd)
    outbox.close()


def test_progress_reports_wait_their_hold_then_go_together_in_order():
    sent: list[m.ProgressReports] = []
    held = ProgressBuffer(sent.append, hold_s=60)
    assert held.poll_timeout_ms(200) == 200  # the loop goes to sleep with nothing held
    held.add(m.Progress(request_id="r1", stage="a", event="admitted"))
    assert _readable(held.wake_fd)  # the first of a burst wakes the sleeping loop, to learn the deadline
    held.awake()
    held.on_wake()
    held.add(m.Progress(request_id="r1", stage="a", event="released"))
    assert not _readable(held.wake_fd)  # ... the rest of it does not
    assert 0 < held.poll_timeout_ms(200) <= 200
    held.flush_due()
    assert sent == [] and held.pending("a") == 2 and held.pending("b") == 0
    held.close()

    awake = ProgressBuffer(sent.append, hold_s=0.05)
    awake.add(m.Progress(request_id="r3", stage="a", event="admitted"))
    assert not _readable(awake.wake_fd)  # an awake loop is not woken: it asks before it sleeps ...
    assert 0 <= awake.poll_timeout_ms(200) <= 51  # ... and then learns the 50 ms deadline
    awake.close()

    due = ProgressBuffer(sent.append, hold_s=0)
    assert due.poll_timeout_ms(200) == 200  # nothing held: sleep as long as the loop likes
    thread = threading.Thread(target=lambda: [
        due.add(m.Progress(request_id="r2", stage="b", event=e))
        for e in ("admitted", "released")])
    thread.start()
    thread.join()
    assert _readable(due.wake_fd)  # a report from another thread wakes the I/O loop once
    due.on_wake()
    due.flush_due()
    assert [[(p.request_id, p.event) for p in burst.reports] for burst in sent] == [
        [("r2", "admitted"), ("r2", "released")]]  # one message
    assert due.pending("b") == 0 and not _readable(due.wake_fd)
    due.close()


def test_an_abort_in_the_same_wake_up_drops_inputs_not_yet_handed_to_the_scheduler():
    """The I/O thread hands accepted inputs over at the end of its wake-up; an abort handled
    before then must take them back, or the scheduler would run a request already aborted."""
    pipeline = pipeline_from_dict(toy_pipeline([
        {"name": "a", "builder": "toy.split", "stream_to": ["b"]},
        {"name": "b", "builder": "toy.upper", "terminal": True}]))
    host = StageHost(HostSpec(run_id=f"{os.getpid()}-handoff", process="b", pipeline=pipeline.model_dump(),
                              addresses={}), BUILDERS)  # not served: no sockets, no scheduler thread
    b = host.stages["b"]
    try:
        host._deliver(b, "gone", "a", 0, {"text": "x"}, True, {})
        host._deliver(b, "kept", "a", 0, {"text": "y"}, True, {})
        assert b.scheduler.inbox.qsize() == 0 and host._stats("b", 0).resources["inbox_items"] == 2
        host._abort("gone")
        host._hand_off()
        inbox = [b.scheduler.inbox.get_nowait() for _ in range(b.scheduler.inbox.qsize())]
        assert [(type(e), e.request_id) for e in inbox] == [(AbortCommand, "gone"), (WorkItem, "kept")]
    finally:
        b.scheduler.outbox.close()
        b.outlet.close()
        host.progress.close()
        host.ctx.term()


async def test_held_back_reports_reach_the_coordinator_and_none_stay_held():
    stages = [{"name": "slow", "builder": "toy.upper", "args": {"delay_ms": 300}, "terminal": True}]
    async with coordinator(stages) as coord:
        handle = coord.submit(data={"text": "x"}, eos=True)
        assert handle.status is RequestStatus.PENDING

        async def running() -> bool:
            return handle.status is RequestStatus.RUNNING

        await wait_for(running, what="the admitted report")
        _, finished = await handle.collect()
        assert finished.status is RequestStatus.COMPLETED
        stats = await coord.wait_idle(timeout=5)
        assert stats["slow"].resources["progress_reports"] == 0


async def test_outputs_keep_their_order_when_the_scheduler_and_io_threads_both_send():
    """One shm block in flight at most: blocks that wait for credit are sent by the I/O thread
    as acks return, while the scheduler thread ships the next ones itself."""
    stages = [{"name": "source", "builder": "toy.blob_source", "terminal": True}]
    async with coordinator(stages, relay={"credits_per_peer": 2}) as coord:
        handle = coord.submit(TurnRequest("", options={"nbytes": 200_000}))
        early = []
        for burst in range(20):  # three inputs per chunk awaited: the credit queue fills and drains
            for i in range(3):
                coord.feed(handle.request_id, {"go": i}, eos=burst == 19 and i == 2)
            early.append(await asyncio.wait_for(handle.next_event(), 10))
        chunks, finished = await asyncio.wait_for(handle.collect(), 30)
        assert finished.status is RequestStatus.COMPLETED
        assert [c.data.index for c in early + chunks] == list(range(60))
        assert all(c.data.blob.nbytes == 200_000 for c in early + chunks)
        await coord.wait_idle(timeout=5)


async def test_shm_output_of_a_step_aborted_while_it_ran_is_dropped_and_no_block_stays_out():
    stages = [
        {"name": "source", "builder": "toy.blob_source", "args": {"delay_ms": 300}, "next": ["sink"]},
        {"name": "sink", "builder": "toy.blob_sink", "terminal": True},
    ]
    async with coordinator(stages) as coord:
        handle = coord.submit(TurnRequest("", options={"nbytes": 3 << 20}), {"go": 1}, eos=True)
        await wait_for(lambda: stage_holds(coord, "source", handle.request_id, "request_states"),
                       what="source computing")
        coord.abort(handle.request_id)
        _, finished = await handle.collect()
        assert finished.status is RequestStatus.ABORTED

        async def dropped() -> bool:
            return (await coord.stats())["source"].counters["dropped_late"] == 1

        await wait_for(dropped, what="the late output dropped")
        stats = await coord.wait_idle(timeout=5)
        assert stats["sink"].counters["admitted"] == 0
        assert stats["source"].resources["relay_blocks_out"] == 0


async def test_shm_handoff_aborted_before_the_consumer_ran_gives_its_block_back():
    stages = [
        {"name": "source", "builder": "toy.blob_source", "next": ["sink"]},
        {"name": "sink", "builder": "toy.blob_sink", "args": {"delay_ms": 400}, "terminal": True},
    ]
    async with coordinator(stages) as coord:
        blocker = coord.submit(TurnRequest("", options={"nbytes": 2 << 20}), {"go": 1}, eos=True)
        await wait_for(lambda: stage_holds(coord, "sink", blocker.request_id, "request_states"),
                       what="sink busy")
        queued = coord.submit(TurnRequest("", options={"nbytes": 2 << 20}), {"go": 2}, eos=True)
        await wait_for(lambda: stage_holds(coord, "sink", queued.request_id, "relay_blocks_in"),
                       what="the queued block held by the sink")
        coord.abort(queued.request_id)
        _, finished = await queued.collect()
        assert finished.status is RequestStatus.ABORTED
        chunks, done = await blocker.collect()
        assert done.status is RequestStatus.COMPLETED and chunks[-1].data.intact
        stats = await coord.wait_idle(timeout=5)
        assert stats["source"].resources["relay_blocks_out"] == 0
        assert stats["sink"].resources["relay_blocks_in"] == 0
        assert stats["sink"].counters["finished"] == 1  # the aborted one never ran

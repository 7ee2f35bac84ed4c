"""The runtime with real stage processes, ZeroMQ sockets and shared memory, on toy stages."""

import asyncio
import os
import signal

import psutil
import pytest

from duplex.runtime import shm
from duplex.runtime.contract import ErrorCode, TurnRequest
from duplex.runtime.requests import RequestStatus
from tests.runtime_helpers import coordinator, stage_holds, wait_for

STREAM = [
    {"name": "split", "builder": "toy.split", "stream_to": ["upper", "count"]},
    {"name": "upper", "builder": "toy.upper", "terminal": True,
     "scheduler": {"kind": "simple", "max_batch_size": 4, "max_wait_ms": 2}},
    {"name": "count", "builder": "toy.count", "terminal": True},
]

SLOW = [  # a -> b, each step of b takes 400 ms so aborts land while it computes
    {"name": "a", "builder": "toy.split", "stream_to": ["b"]},
    {"name": "b", "builder": "toy.upper", "args": {"delay_ms": 400}, "terminal": True},
]


def texts(chunks, stage):
    return [c.data["text"] for c in chunks if c.stage == stage]


async def test_streaming_order_and_fan_in_of_two_terminals():
    words = [f"w{i}" for i in range(300)]
    async with coordinator(STREAM) as coord:
        handle = coord.submit(TurnRequest("s"), {"text": " ".join(words)}, eos=True)
        chunks, finished = await asyncio.wait_for(handle.collect(), 30)
        assert finished.status is RequestStatus.COMPLETED
        assert texts(chunks, "upper") == [w.upper() for w in words]
        counts = [c for c in chunks if c.stage == "count"]
        assert [c.data for c in counts] == [{"count": 300}] and counts[0].final
        assert [c.final for c in chunks if c.stage == "upper"] == [False] * 299 + [True]
        await coord.wait_idle(timeout=5)


async def test_streamed_client_input_and_concurrent_requests_stay_separate():
    async with coordinator(STREAM) as coord:
        handles = [coord.submit(TurnRequest(f"s{i}")) for i in range(12)]
        for step in range(3):
            for i, handle in enumerate(handles):
                coord.feed(handle.request_id, {"text": f"r{i}s{step}a r{i}s{step}b"}, eos=step == 2)
        results = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 30)
        for i, (chunks, finished) in enumerate(results):
            assert finished.status is RequestStatus.COMPLETED
            expected = [f"R{i}S{s}{x}" for s in range(3) for x in "AB"]
            assert texts(chunks, "upper") == expected
            assert [c.data for c in chunks if c.stage == "count"] == [{"count": 6}]
        await coord.wait_idle(timeout=5)


async def test_wait_for_gathers_every_upstream_before_running():
    stages = [
        {"name": "src", "builder": "toy.split", "next": ["left", "right"]},
        {"name": "left", "builder": "toy.upper", "next": ["join"]},
        {"name": "right", "builder": "toy.count", "next": ["join"]},
        {"name": "join", "builder": "toy.join", "wait_for": ["left", "right"], "terminal": True},
    ]
    async with coordinator(stages) as coord:
        handle = coord.submit(data={"text": "one two three"}, eos=True)
        chunks, finished = await asyncio.wait_for(handle.collect(), 30)
        assert finished.status is RequestStatus.COMPLETED
        assert [c.data for c in chunks] == [{"joined": {"left": {"text": "THREE", "index": 2, "batch": 1},
                                                         "right": {"count": 1}}}]


async def test_simple_scheduler_batches_across_requests_up_to_its_limit():
    stages = [{"name": "upper", "builder": "toy.upper", "terminal": True,
               "scheduler": {"kind": "simple", "max_batch_size": 4, "max_wait_ms": 100}}]
    async with coordinator(stages) as coord:
        handles = [coord.submit(data={"text": f"r{i}"}, eos=True) for i in range(10)]
        results = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 30)
        batches = [chunks[0].data["batch"] for chunks, _ in results]
        assert [chunks[0].data["text"] for chunks, _ in results] == [f"R{i}" for i in range(10)]
        assert max(batches) > 1 and max(batches) <= 4


async def test_tensors_cross_stages_through_shared_memory():
    stages = [
        {"name": "source", "builder": "toy.blob_source", "next": ["sink"]},
        {"name": "sink", "builder": "toy.blob_sink", "terminal": True},
    ]
    async with coordinator(stages) as coord:
        for nbytes in (10, 200_000, 3 << 20):
            handle = coord.submit(TurnRequest("", options={"nbytes": nbytes}), {"go": 1}, eos=True)
            chunks, finished = await asyncio.wait_for(handle.collect(), 30)
            assert finished.status is RequestStatus.COMPLETED
            assert chunks[-1].data.nbytes == nbytes and chunks[-1].data.intact
        assert shm.list_segments(shm.run_prefix(coord.run_id))  # the big ones went through shm
        await coord.wait_idle(timeout=5)


async def test_abort_while_a_step_is_in_flight_drops_its_output_and_frees_state():
    async with coordinator(SLOW) as coord:
        handle = coord.submit(data={"text": "x"}, eos=True)
        await wait_for(lambda: stage_holds(coord, "b", handle.request_id, "request_states"), what="b computing")
        assert coord.abort(handle.request_id)
        assert coord.abort(handle.request_id) is False  # idempotent
        chunks, finished = await handle.collect()
        assert finished.status is RequestStatus.ABORTED and chunks == []
        await coord.wait_idle(timeout=2)  # state is freed once the step in flight returns
        stats = await coord.stats()
        assert stats["b"].counters["dropped_late"] >= 1  # the step's output was produced, then dropped


async def test_abort_before_the_handoff_is_consumed():
    async with coordinator(SLOW) as coord:
        blocker = coord.submit(data={"text": "first"}, eos=True)
        await wait_for(lambda: stage_holds(coord, "b", blocker.request_id, "request_states"), what="b busy")
        queued = coord.submit(data={"text": "second"}, eos=True)
        await wait_for(lambda: stage_holds(coord, "b", queued.request_id, "inbox_items"), what="handoff queued")
        coord.abort(queued.request_id)
        _, finished = await queued.collect()
        assert finished.status is RequestStatus.ABORTED
        chunks, done = await blocker.collect()
        assert done.status is RequestStatus.COMPLETED and texts(chunks, "b") == ["FIRST"]
        stats = await coord.wait_idle(timeout=2)
        assert stats["b"].counters["finished"] == 1  # the queued one never ran


async def test_producer_finishing_after_the_abort_never_reaches_the_consumer():
    stages = [
        {"name": "a", "builder": "toy.upper", "args": {"delay_ms": 400}, "next": ["b"]},
        {"name": "b", "builder": "toy.count", "terminal": True},
    ]
    async with coordinator(stages) as coord:
        handle = coord.submit(data={"text": "x"}, eos=True)
        await wait_for(lambda: stage_holds(coord, "a", handle.request_id, "request_states"), what="a computing")
        coord.abort(handle.request_id)
        await wait_for(lambda: _counter(coord, "a", "dropped_late"), what="a's late output dropped")
        stats = await coord.wait_idle(timeout=2)
        assert stats["b"].counters["admitted"] == 0


async def _counter(coord, stage, name):
    return (await coord.stats())[stage].counters[name] > 0


async def test_killed_stage_fails_its_requests_restarts_and_serves_again():
    async with coordinator(SLOW) as coord:
        handle = coord.submit(data={"text": "doomed"}, eos=True)
        await wait_for(lambda: stage_holds(coord, "b", handle.request_id), what="b holds the request")
        old_pid = (await coord.stats())["b"].pid
        os.kill(old_pid, signal.SIGKILL)
        _, finished = await asyncio.wait_for(handle.collect(), 10)
        assert finished.status is RequestStatus.FAILED
        assert "stage b" in str(finished.error) and "died" in str(finished.error) and "-9" in str(finished.error)

        async def restarted():
            try:
                return (await coord.stats(timeout=0.5))["b"].pid != old_pid
            except TimeoutError:
                return False

        await wait_for(restarted, timeout=30, what="b restarted")
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "again"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and texts(chunks, "b") == ["AGAIN"]
        assert coord.restarts == 1
        await coord.wait_idle(timeout=2)


async def test_failing_computation_fails_only_its_request():
    async with coordinator(STREAM) as coord:
        bad = coord.submit(data={"no_text_key": 1}, eos=True)  # split chokes on it
        good = coord.submit(data={"text": "fine"}, eos=True)
        _, failed = await asyncio.wait_for(bad.collect(), 10)
        chunks, ok = await asyncio.wait_for(good.collect(), 10)
        assert failed.status is RequestStatus.FAILED
        assert failed.error.code is ErrorCode.STAGE_FAILED and failed.error.stage == "split"
        assert ok.status is RequestStatus.COMPLETED and texts(chunks, "upper") == ["FINE"]
        await coord.wait_idle(timeout=2)


async def test_shutdown_leaves_no_process_segment_or_socket_file():
    coord = coordinator(STREAM)
    await coord.start()
    handle = coord.submit(data={"text": "a b"}, eos=True)
    await handle.collect()
    pids = [view.pid for view in (await coord.stats()).values()]
    run_dir, prefix = coord.procs.run_dir, shm.run_prefix(coord.run_id)
    await coord.shutdown()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert shm.list_segments(prefix) == []
    assert not os.path.exists(run_dir)
    async with coordinator(STREAM) as again:  # a second start right away works
        _, done = await again.submit(data={"text": "b"}, eos=True).collect()
        assert done.status is RequestStatus.COMPLETED


async def test_tcp_control_plane_carries_payloads_inline():
    async with coordinator(STREAM, control={"transport": "tcp"}) as coord:
        assert coord.procs.addresses["upper"].startswith("tcp://127.0.0.1:")
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "x y"}, eos=True).collect(), 10)
        assert done.status is RequestStatus.COMPLETED and texts(chunks, "upper") == ["X", "Y"]
        assert shm.list_segments(shm.run_prefix(coord.run_id)) == []


async def test_fused_stages_share_a_process_and_pass_objects():
    stages = [{**s, "process": "fused"} if s["name"] in ("split", "upper") else s for s in STREAM]
    async with coordinator(stages) as coord:
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "p q"}, eos=True).collect(), 20)
        assert done.status is RequestStatus.COMPLETED and texts(chunks, "upper") == ["P", "Q"]
        stats = await coord.wait_idle(timeout=2)
        assert stats["split"].pid == stats["upper"].pid != stats["count"].pid
        assert len(coord.procs.procs) == 2


async def test_terminal_keys_limit_what_the_client_gets_but_not_the_next_stage():
    stages = [
        {"name": "split", "builder": "toy.split", "stream_to": ["upper"], "terminal": True, "terminal_keys": ["text"]},
        {"name": "upper", "builder": "toy.upper", "terminal": True},
    ]
    async with coordinator(stages) as coord:
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "k"}, eos=True).collect(), 20)
        assert done.status is RequestStatus.COMPLETED
        assert [c.data for c in chunks if c.stage == "split"] == [{"text": "k"}]  # no "index"
        assert [c.data for c in chunks if c.stage == "upper"] == [{"text": "K", "index": 0, "batch": 1}]


async def test_a_bad_row_fails_alone_not_its_batch_mates():
    stages = [{"name": "upper", "builder": "toy.upper", "terminal": True,
               "scheduler": {"kind": "simple", "max_batch_size": 8, "max_wait_ms": 200}}]
    async with coordinator(stages) as coord:
        good = [coord.submit(data={"text": f"g{i}"}, eos=True) for i in range(3)]
        bad = coord.submit(data={"no_text": 1}, eos=True)
        _, failed = await asyncio.wait_for(bad.collect(), 20)
        assert failed.status is RequestStatus.FAILED and "KeyError" in failed.error.message
        assert failed.error.code is ErrorCode.STAGE_FAILED and failed.error.stage == "upper"
        for i, handle in enumerate(good):
            chunks, done = await asyncio.wait_for(handle.collect(), 20)
            assert done.status is RequestStatus.COMPLETED and texts(chunks, "upper") == [f"G{i}"]
        await coord.wait_idle(timeout=2)


def _thread_nices(pid: int) -> set[int]:
    """The nice of every thread of a process (Linux keeps one per thread: field 19 of its stat)."""
    nices = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            nices.add(int(stat.read().rsplit(")", 1)[1].split()[16]))
    return nices


async def test_stage_processes_yield_the_cpu_by_their_nice_on_every_thread():
    stages = [{**STREAM[0], "process": "fused"}, {**STREAM[1], "process": "fused", "nice": 3},
              {**STREAM[2], "nice": 0}]
    base = os.nice(0)
    async with coordinator(stages) as coord:
        chunks, done = await asyncio.wait_for(coord.submit(data={"text": "n"}, eos=True).collect(), 20)
        assert done.status is RequestStatus.COMPLETED  # every scheduler thread has started
        stats = await coord.wait_idle(timeout=2)
        # split is a CPU stage with no nice of its own (10); fused with upper (3), the lower wins
        assert _thread_nices(stats["split"].pid) == {min(base + 3, 19)}
        assert _thread_nices(stats["count"].pid) == {base}
        assert len(os.listdir(f"/proc/{stats['split'].pid}/task")) > 1, "the check must see the stage's threads"


def test_a_stage_nice_defaults_by_device_and_scheduler_and_refuses_out_of_range():
    from duplex.config import load_pipeline
    from duplex.config.pipeline import CPU_STAGE_NICE, StageConfig

    assert StageConfig(name="a", builder="b").niceness == CPU_STAGE_NICE
    assert StageConfig(name="a", builder="b", device="cuda").niceness == 0
    # a stream stage computes nothing (it relays an engine's reply): level with the engine
    assert StageConfig(name="a", builder="b", scheduler={"kind": "stream"}).niceness == 0
    engine = {stage.name: stage.niceness for stage in load_pipeline("engine").stages}
    assert engine == {"asr": CPU_STAGE_NICE, "thinker": 0, "tts": CPU_STAGE_NICE}
    assert StageConfig(name="a", builder="b", nice=0).niceness == 0
    with pytest.raises(ValueError, match="nice"):
        StageConfig(name="a", builder="b", nice=20)

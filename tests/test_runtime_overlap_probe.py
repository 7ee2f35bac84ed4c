"""An ``OverlapProbe`` (transcribe, answer nothing) with real stage processes: it reaches the entry
stage only, its outputs come back to the client and go no further, it completes when the entry
stage finishes, and nothing is left held; a pipeline whose entry stage is not terminal refuses it
at once."""

import asyncio

from duplex.runtime.contract import ErrorCode, OverlapProbe, TurnRequest
from duplex.runtime.requests import RequestStatus
from tests.runtime_helpers import coordinator

# the entry stage answers the client itself and streams on, as an ASR does (local.yaml)
HEARS = [
    {"name": "split", "builder": "toy.split", "stream_to": ["upper"], "terminal": True},
    {"name": "upper", "builder": "toy.upper", "terminal": True},
]
DEAF = [  # the entry stage is not terminal (as omni-tiny's encoder): nothing would answer a probe
    {"name": "split", "builder": "toy.split", "stream_to": ["upper"]},
    {"name": "upper", "builder": "toy.upper", "terminal": True},
]


async def test_a_probe_reaches_the_entry_stage_only_and_ends_there():
    async with coordinator(HEARS) as coord:
        probe = coord.submit(OverlapProbe("s"), {"text": "sorry can I"})
        coord.feed(probe.request_id, {"text": "ask"}, eos=True)
        turn = coord.submit(TurnRequest("s"), {"text": "sorry can I ask"}, eos=True)
        (probed, probe_end), (answered, turn_end) = await asyncio.wait_for(
            asyncio.gather(probe.collect(), turn.collect()), 30)
        assert probe_end.status is turn_end.status is RequestStatus.COMPLETED
        assert [(c.stage, c.data["text"]) for c in probed if c.data] == [
            ("split", w) for w in ("sorry", "can", "I", "ask")]
        assert [c.data["text"] for c in answered if c.stage == "upper" and c.data] == ["SORRY", "CAN", "I", "ASK"]
        stats = await coord.wait_idle(timeout=5)
        assert stats["split"].counters["admitted"] == 2 and stats["upper"].counters["admitted"] == 1


async def test_an_aborted_probe_leaves_nothing_held():
    async with coordinator(HEARS) as coord:
        probe = coord.submit(OverlapProbe("s"), {"text": "uh huh"})
        assert coord.abort(probe.request_id)
        _, finished = await asyncio.wait_for(probe.collect(), 10)
        assert finished.status is RequestStatus.ABORTED
        await coord.wait_idle(timeout=5)


async def test_a_pipeline_whose_entry_stage_is_not_terminal_refuses_a_probe_at_once():
    async with coordinator(DEAF) as coord:
        probe = coord.submit(OverlapProbe("s"), {"text": "uh huh"}, eos=True)
        _, finished = await asyncio.wait_for(probe.collect(), 5)
        assert finished.status is RequestStatus.FAILED and finished.error.code is ErrorCode.BAD_INPUT
        assert "terminal entry stage" in finished.error.message
        stats = await coord.wait_idle(timeout=5)
        assert stats["split"].counters["admitted"] == 0

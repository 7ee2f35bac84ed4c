"""The default `local` pipeline (configs/local.yaml) in real stage processes: Whisper ASR ->
Gemma thinker (ar scheduler) -> Piper TTS, joined by the runtime's control and data planes.
One pipeline for the module; each test ends by checking that no stage holds anything."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from duplex.audio import resample
from duplex.config import load_pipeline
from duplex.models.local import assets
from duplex.models.local.asr import WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex.models.registry import BUILDERS
from duplex.runtime.contract import AgentAudio, AgentText, CallerAudio, SessionEnd, Transcript, TurnRequest
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import OutputChunk, RequestFinished
from tests.local_helpers import ORDER, caller_audio, chunks, silence, speak

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]
TURN_TIMEOUT_S = 180  # a whole turn on a loaded 2-core box


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipeline():
    assets.prepare_all()  # a no-op once the cache exists
    coordinator = Coordinator(load_pipeline("local"), BUILDERS)
    await coordinator.start()
    yield coordinator
    await coordinator.shutdown()


@pytest.fixture(scope="module")
def order_audio() -> np.ndarray:
    return np.concatenate([speak(ORDER), silence(0.5)])


def _feed_turn(pipeline: Coordinator, audio: np.ndarray, session_id: str):
    handle = pipeline.submit(TurnRequest(session_id=session_id, turn=1))
    pieces = caller_audio(chunks(audio))
    for index, piece in enumerate(pieces):
        assert pipeline.feed(handle.request_id, piece, eos=index == len(pieces) - 1)
    return handle


async def _events(handle, timeout: float = TURN_TIMEOUT_S) -> tuple[list[OutputChunk], RequestFinished]:
    import asyncio

    async def gather():
        chunks_seen = []
        async for event in handle:
            if isinstance(event, RequestFinished):
                return chunks_seen, event
            chunks_seen.append(event)
        raise AssertionError("the request's events ended without a RequestFinished")

    return await asyncio.wait_for(gather(), timeout)


async def _assert_nothing_held(pipeline: Coordinator) -> None:
    stats = await pipeline.wait_idle(timeout=10)
    assert stats["thinker"].resources["kv_slots"] == 0
    assert stats["thinker"].resources["open_rows"] == 0


async def test_an_order_is_heard_answered_and_the_answer_is_speech(pipeline, order_audio):
    handle = _feed_turn(pipeline, order_audio, session_id="order")
    outputs, finished = await _events(handle)
    assert finished.status.value == "completed", finished.error

    transcripts = [c.data for c in outputs if c.stage == "asr"]
    assert all(isinstance(t, Transcript) for t in transcripts)
    assert transcripts[-1].final and c_final(outputs, "asr")
    assert "bubble tea" in transcripts[-1].text.lower()

    reply = "".join(c.data.text for c in outputs if c.stage == "thinker" and isinstance(c.data, AgentText)).strip()
    assert reply and c_final(outputs, "thinker").data is None

    audio = [c.data for c in outputs if c.stage == "tts" and isinstance(c.data, AgentAudio)]
    assert audio, "the agent never spoke"
    first_audio_index = next(i for i, c in enumerate(outputs) if c.stage == "tts" and c.data)
    thinker_final_index = outputs.index(c_final(outputs, "thinker"))
    assert first_audio_index < thinker_final_index, "speech should start before the reply is complete"
    voiced = " ".join(a.text.strip() for a in audio)
    assert voiced.split() == reply.split(), "each chunk says the phrase it voices, and they make the reply"
    rate = audio[0].sample_rate
    speech = resample(np.concatenate([a.samples for a in audio]), rate, 16000)
    heard = WhisperTranscriber(assets.prepare_whisper(), hint=BUBBLE_TEA_ASR_HINT).transcribe([speech], 3000)[0]
    assert len(heard.split()) >= 3, f"the agent's speech was heard as {heard!r} (reply: {reply!r})"
    await _assert_nothing_held(pipeline)


async def test_barge_in_abort_frees_the_thinker_slots(pipeline, order_audio):
    handle = _feed_turn(pipeline, order_audio, session_id="barge-in")
    async for event in handle:
        assert not isinstance(event, RequestFinished), f"finished before the reply started: {event}"
        if event.stage == "thinker":
            assert not event.final
            break  # the reply is being generated: the user talks over it
    held = (await pipeline.stats())["thinker"]
    assert held.resources["kv_slots"] == 1 and handle.request_id in held.request_ids
    assert pipeline.abort(handle.request_id)
    _, finished = await _events(handle, timeout=30)
    assert finished.status.value == "aborted"
    await _assert_nothing_held(pipeline)


async def test_audio_that_is_not_audio_fails_its_request_only(pipeline):
    handle = pipeline.submit(TurnRequest(session_id="bad"))
    pipeline.feed(handle.request_id, CallerAudio("not samples"), eos=True)
    _, finished = await _events(handle, timeout=60)
    assert finished.status.value == "failed"
    assert finished.error.stage == "asr" and "ValueError" in finished.error.message, finished.error
    await _assert_nothing_held(pipeline)


def c_final(outputs: list[OutputChunk], stage: str) -> OutputChunk:
    return next(c for c in outputs if c.stage == stage and c.final)


async def test_a_session_end_request_is_answered_with_nothing_and_holds_nothing(pipeline):
    """What a session sends at hang-up (the thinker frees the session: test_local_history.py)."""
    handle = pipeline.submit(SessionEnd(session_id="ending"), eos=True)
    outputs, finished = await _events(handle, timeout=60)
    assert finished.status.value == "completed", finished.error
    assert [c.data for c in outputs if c.stage == "asr"] == [Transcript("", final=True)]
    assert [c.data for c in outputs if c.stage == "thinker"] == [None]
    assert not any(isinstance(c.data, AgentAudio) for c in outputs)
    await _assert_nothing_held(pipeline)

"""The qwen3_omni pipeline through real stage processes (encoder -> thinker -> talker ->
code2wav, ZeroMQ + shared memory): outputs equal transformers' generate(), concurrent requests
equal lone ones, and aborts at any point leave every stage holding nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import torch
import yaml

from duplex.config import pipeline_from_dict
from duplex.config.loader import resolve_config_path
from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
from duplex.models.qwen3_omni.loading import load_code2wav
from duplex.models.qwen3_omni.payloads import TextToken, VocodedAudio
from duplex.models.qwen3_omni.tiny import init_tiny
from duplex.models.registry import BUILDERS
from duplex.runtime.contract import CallerAudio, TurnRequest
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.requests import OutputChunk, RequestFinished, RequestStatus
from duplex_tools.qwen3_omni.reference import Reference

torch.set_num_threads(1)
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
CONFIG = resolve_config_path("omni-tiny")
SYSTEM = [11, 12, 13, 14]  # the config's system_ids
PARAMS = TurnRequest(session_id="omni", max_new_tokens=10, options={"talker_max_new_tokens": 20})
FEED = 4000  # 250 ms of user audio per feed


def omni_config(model_dir: Path):
    raw = yaml.safe_load(CONFIG.read_text())
    for stage in raw["stages"]:
        stage["args"]["model_dir"] = str(model_dir)
    return pipeline_from_dict(raw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp() / "omni-tiny"
    if not (path / "model.safetensors").exists():
        init_tiny(path)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def coord(model_dir):
    coordinator = Coordinator(omni_config(model_dir), BUILDERS)
    await coordinator.start()
    yield coordinator
    await coordinator.shutdown()


def speech_like(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


async def speak(coord, audio: np.ndarray, params=PARAMS, pace_s: float = 0.0):
    handle = coord.submit(params)
    for start in range(0, len(audio), FEED):
        coord.feed(handle.request_id, CallerAudio(audio[start:start + FEED]), eos=start + FEED >= len(audio))
        if pace_s:
            await asyncio.sleep(pace_s)
    return handle


def outputs(chunks: list[OutputChunk]):
    # The client gets the thinker's TextTokens (not the embeddings the talker gets) and VocodedAudio.
    assert all(isinstance(c.data, TextToken) for c in chunks if c.stage == "thinker" and c.data is not None)
    tokens = [t for c in chunks if c.stage == "thinker" and c.data for t in c.data.token_ids]
    audio = [c.data for c in chunks if c.stage == "code2wav" and c.data is not None]
    assert all(isinstance(a, VocodedAudio) for a in audio)
    codes = np.concatenate([a.codes for a in audio], axis=1)
    wav = np.concatenate([a.samples for a in audio])
    assert all(a.sample_rate == 24000 for a in audio)
    return tokens, codes, wav


async def test_eight_concurrent_turns_equal_generate_and_streamed_audio_equals_full_decode(coord, model_dir):
    audios = [speech_like(1.2 + 0.25 * i, 100 + i) for i in range(8)]
    reference = Reference(str(model_dir))
    expected = [reference.run(a, system_ids=SYSTEM, thinker_max_new_tokens=10, talker_max_new_tokens=20)
                for a in audios]
    vocoder = StreamingCode2Wav(load_code2wav(model_dir)[0])
    handles = [await speak(coord, a, pace_s=0.01) for a in audios]
    results = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 120)
    for (chunks, finished), ref in zip(results, expected):
        assert finished.status is RequestStatus.COMPLETED, finished.error
        tokens, codes, wav = outputs(chunks)
        assert tokens == ref.text_tokens
        assert np.array_equal(codes, ref.codes.numpy())
        full = vocoder.decode_full(ref.codes)
        assert wav.shape == full.shape == ref.waveform.shape
        assert np.linalg.norm(wav - full) / np.linalg.norm(full) <= 1e-4
        assert np.linalg.norm(wav - ref.waveform) / np.linalg.norm(ref.waveform) <= 1e-4
        assert sum(1 for c in chunks if c.stage == "code2wav") > 2  # streamed, not one block
    await coord.wait_idle(timeout=10)


async def _abort_when(coord, handle, point: str) -> tuple[RequestStatus, float]:
    """Abort at ``point``; return the final status and the time from abort to every stage idle."""
    thinker_chunks = 0
    async for event in handle:
        if isinstance(event, RequestFinished):
            return event.status, float("nan")
        thinker_chunks += event.stage == "thinker"
        hit = (point == "mid_thinker" and thinker_chunks == 2
               or point == "mid_talker" and event.stage == "thinker" and event.final
               or point == "mid_vocoder" and event.stage == "code2wav")
        if hit:
            break
    aborted_at = time.monotonic()
    coord.abort(handle.request_id)
    return handle.status, aborted_at


async def test_aborts_at_every_point_leave_every_stage_holding_nothing(coord):
    rng = np.random.default_rng(5)
    points = ["before_prefill", "mid_thinker", "mid_talker", "mid_vocoder"] * 2
    rng.shuffle(points)
    long = TurnRequest(session_id="omni", max_new_tokens=30, options={"talker_max_new_tokens": 200})
    tasks, handles = [], []
    for i, point in enumerate(points):
        audio = speech_like(1.0 + 0.1 * i, 200 + i)
        if point == "before_prefill":  # the user is still speaking: no end of input yet
            handle = coord.submit(long)
            coord.feed(handle.request_id, CallerAudio(audio[:FEED]))
            await asyncio.sleep(float(rng.uniform(0, 0.05)))
            coord.abort(handle.request_id)
            tasks.append(asyncio.sleep(0, result=(RequestStatus.ABORTED, time.monotonic())))
        else:
            handle = await speak(coord, audio, long)
            tasks.append(_abort_when(coord, handle, point))
        handles.append(handle)
    ended = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    last_abort = max(at for _, at in ended)
    stats = await coord.wait_idle(timeout=10, interval=0.002)
    idle_after = time.monotonic() - last_abort
    for handle in handles:
        assert handle.status is RequestStatus.ABORTED
    assert all(view.held == 0 for view in stats.values())
    print(f"\nevery stage idle {idle_after * 1000:.1f} ms after the last abort")
    # Nothing was left half-alive: a new turn still matches a lone run.
    chunks, finished = await asyncio.wait_for((await speak(coord, speech_like(1.0, 300))).collect(), 60)
    assert finished.status is RequestStatus.COMPLETED
    await coord.wait_idle(timeout=10)


async def test_bad_audio_fails_only_that_request(coord):
    bad = coord.submit(PARAMS)
    coord.feed(bad.request_id, {"audio": speech_like(0.5, 1)}, eos=True)  # not a CallerAudio
    good = await speak(coord, speech_like(1.0, 2))
    (bad_chunks, bad_end), (good_chunks, good_end) = await asyncio.wait_for(
        asyncio.gather(bad.collect(), good.collect()), 60)
    assert bad_end.status is RequestStatus.FAILED and "needs CallerAudio" in bad_end.error.message
    assert good_end.status is RequestStatus.COMPLETED
    assert len(outputs(good_chunks)[0]) == PARAMS.max_new_tokens
    await coord.wait_idle(timeout=10)

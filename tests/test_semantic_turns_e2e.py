"""Semantic end of turn end to end: a real aiortc client against `duplex serve --config toy-voice`
with ``turn_detection: semantic_vad`` and the real Smart Turn model, the caller's speech made at
test time with Piper (without its noise: the same samples every run) and sent over Opus.

A finished sentence is judged complete at the check pause and its answer released there; one that
trails off in a filler is judged incomplete, the caller goes on after a pause longer than the plain
VAD's end-of-turn silence, and one reply answers the whole sentence. The model's verdicts have
wide margins on these clips (0.98 and 0.01 measured), so the test depends on no threshold luck."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex.audio import resample
from duplex.config.session import SessionConfig
from duplex_tools.client import RATE, RealtimeClient
from duplex_tools.harness import ServerProcess
from tests.local_helpers import speak

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates")]

SEMANTIC = {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}}
LONGEST_MS = SessionConfig(turn_detection="semantic_vad").silence_ms
WARM_UP_TURNS = 6  # the server loads the model when a session first wants it (seconds on a cold machine)
PAUSE_S = 1.2  # mid-sentence: over the plain VAD's 500 ms silence, under the semantic longest pause


def _voice(text: str) -> np.ndarray:
    return resample(speak(text), 16000, RATE)


def _gap(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback"]) as proc:
        yield proc


@pytest.fixture
async def warm(server):
    """Turns until one is judged: until then the model was still loading and each turn ended by
    the longest pause instead (a judgement that comes after the turn ended is not sent)."""
    for _ in range(WARM_UP_TURNS):
        client = RealtimeClient(server.url)
        await client.connect(session=SEMANTIC)
        try:
            client.mic.play(np.concatenate([_gap(0.4), _voice("Tell me a joke."), _gap(0.5 + LONGEST_MS / 1000)]))
            await client.wait_event("input_audio_buffer.speech_stopped", timeout=30)
            if client.of_type("duplex.turn.judged"):
                return server
        finally:
            await client.hang_up()
    raise AssertionError(f"no turn was judged in {WARM_UP_TURNS} turns: the end-of-turn model never loaded")


async def test_a_finished_sentence_ends_the_turn_at_the_judged_pause(server, warm):
    client = RealtimeClient(server.url)
    await client.connect(session=SEMANTIC)
    try:
        described = client.of_type("session.created")[0]["session"]["audio"]["input"]["turn_detection"]
        assert described["type"] == "semantic_vad"
        client.mic.play(np.concatenate([_gap(0.4), _voice("I would like a bubble tea with less ice."), _gap(3.0)]))
        judged = await client.wait_event("duplex.turn.judged", timeout=30)
        stopped = await client.wait_event("input_audio_buffer.speech_stopped", timeout=10)
        assert judged["complete"] and judged["probability"] > 0.5 and not judged["words_hang"], judged
        assert stopped["audio_end_ms"] == judged["audio_end_ms"]  # the judgement ended it, not a silence
        created = await client.wait_event("response.created", timeout=10)
        committed = await client.wait_event("duplex.preemptive.committed", timeout=10)
        assert committed["response_id"] == created["response"]["id"]  # the answer started at the pause
        await client.wait_event("output_audio_buffer.stopped", timeout=30, response_id=created["response"]["id"])
    finally:
        assert await client.hang_up() == 204


async def test_a_sentence_trailing_off_waits_past_the_vad_silence_and_one_reply_answers_it_all(server, warm):
    client = RealtimeClient(server.url)
    await client.connect(session=SEMANTIC)
    try:
        clip = client.mic.play(np.concatenate([_gap(0.4), _voice("I would like to order a large, um,"), _gap(PAUSE_S),
                                               _voice("mango tea with pearls please."), _gap(3.0)]))
        first = await client.wait_event("duplex.turn.judged", timeout=30)
        assert not first["complete"] and first["probability"] < 0.5, first
        stopped = await client.wait_event("input_audio_buffer.speech_stopped", timeout=30)
        assert stopped["audio_end_ms"] > first["audio_end_ms"] + 1000 * PAUSE_S  # after the second half
        created = await client.wait_event("response.created", timeout=10)
        await client.wait_event("output_audio_buffer.stopped", timeout=30, response_id=created["response"]["id"])
        await asyncio.wait_for(clip.ended.wait(), 30)
        assert len(client.of_type("response.created")) == 1
        assert len(client.of_type("duplex.preemptive.cancelled")) == 1  # the first pause's speculation, unheard
        judged = client.of_type("duplex.turn.judged")
        ended_by = "judged" if judged[-1]["complete"] else f"the longest pause ({LONGEST_MS} ms)"
        print(f"\njudged: {[(j['probability'], j['complete']) for j in judged]}; the turn ended by {ended_by}")
    finally:
        assert await client.hang_up() == 204

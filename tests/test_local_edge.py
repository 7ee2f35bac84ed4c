"""The default server (`duplex serve`, configs/local.yaml) called over real WebRTC on loopback:
a spoken order synthesized at test time goes in through the edge, and the agent's reply comes
back as audio that Whisper can understand. Then a barge-in, after which no stage holds anything,
and the barge-in that hears the words: "uh-huh" over the reply resumes it, "Sorry," and a pause
longer than ``resume_ms`` cut it for good (the sound alone would resume it in that pause)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from duplex.audio import resample
from duplex.config.session import BargeInConfig
from duplex.models.local import assets
from duplex.models.local.asr import WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from duplex_tools.probes import ask, hear
from tests.local_helpers import INTERRUPTION, ORDER, speak, voiced_ms

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.usefixtures("loopback_candidates")]
SILENCE_TURNS = {"turn_detection": {"type": "server_vad"}}  # the pipeline's sessions default to semantic_vad


@pytest.fixture(scope="module")
def server():
    assets.prepare_all()  # the server would do it too, but inside its start-up time
    # Every reply is exactly max_new_tokens long (48 tokens, ~12 s of speech) and written at no more
    # than one token per 150 ms (7.2 s, still ahead of its playout) on any CPU: an interruption
    # 0.1 s into the first phrase of a silence-ended turn (speculation 300 ms before the turn ends,
    # the first phrase ~10 tokens, the cut 600 ms of voice later: ~2.5 s) lands while the thinker
    # still writes, whatever the model would have said and however fast the machine is.
    args = ["--port", "0", "--ice-loopback", "--max-sessions", "2", "--thinker.args.min_new_tokens", "48",
            "--thinker.args.min_step_ms", "150"]
    with ServerProcess(args, ready_timeout=300) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


@pytest.fixture(scope="module")
def order() -> np.ndarray:
    return speak(ORDER, rate=48000)


@pytest.fixture(scope="module")
def overlaps() -> tuple[np.ndarray, np.ndarray]:
    """ "Uh-huh." and "Sorry," + a pause + "can I ask something else?" (Piper, 48 kHz). The pause
    (Piper's own after the comma, ~240 ms, and 100 ms) is longer than ``resume_ms`` (the sound
    alone resumes the reply there) and shorter than the silence that ends a turn (one turn; the test's
    callers ask for silence-ended turns: a judged pause would hang on Smart Turn's verdict on "Sorry,")."""
    pause = np.zeros(int(48000 * 0.1), np.float32)
    sorry = np.concatenate([speak("Sorry,", rate=48000), pause, speak("can I ask something else?", rate=48000)])
    return speak("Uh-huh.", rate=48000), sorry


@pytest.fixture(scope="module")
def question_and_interruption() -> tuple[np.ndarray, np.ndarray]:
    # Made before any call: synthesis inside the test would stall the client's event loop.
    interruption = speak(INTERRUPTION, rate=48000)
    assert voiced_ms(interruption, 48000) >= 2 * BargeInConfig().interrupt_ms, "the cut must not wait on words"
    return speak("What flavors do you have?", rate=48000), interruption


async def _stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        reply = await http.get("/duplex/stats")
        assert reply.status_code == 200
        return reply.json()


async def _wait_idle(url: str, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        current = await _stats(url)
        stages = current["stages"]
        if all(v["live_requests"] == 0 and not any(v["resources"].values()) for v in stages.values()):
            return current
        assert time.monotonic() < deadline, f"stages still hold state: {stages}"
        await asyncio.sleep(0.05)


async def _response_done(client: RealtimeClient, created: dict, timeout: float) -> dict:
    """The response.done of the response ``created`` announced (not just the next one)."""
    response_id = created["response"]["id"]
    deadline = time.monotonic() + timeout
    while True:
        for event in client.of_type("response.done"):
            if event["response"]["id"] == response_id:
                return event
        await client.wait_event("response.done", timeout=max(0.0, deadline - time.monotonic()), after=time.monotonic())


async def test_a_spoken_order_gets_an_intelligible_spoken_reply(server, order):
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, order, timeout=60)
        response_id = created["response"]["id"]
        transcript = await client.wait_event("conversation.item.input_audio_transcription.completed", timeout=60)
        assert "bubble tea" in transcript["transcript"].lower(), transcript
        started = await client.wait_event("output_audio_buffer.started", timeout=60, response_id=response_id)
        done = await client.wait_event("response.done", timeout=120)
        assert done["response"]["id"] == response_id and done["response"]["status"] == "completed", done
        await client.wait_event("output_audio_buffer.stopped", timeout=60, response_id=response_id)
        reply = np.concatenate([h.pcm for h in client.heard if h.at >= client.time_of(started) - 0.1])
        heard = WhisperTranscriber(assets.prepare_whisper(), hint=BUBBLE_TEA_ASR_HINT).transcribe(
            [resample(reply, 48000, 16000)[: 30 * 16000]], 3000)[0]
        assert len(heard.split()) >= 3, f"the agent's reply was heard as {heard!r}"
        await _wait_idle(server.url)
    finally:
        await client.hang_up()


async def test_barge_in_frees_the_thinker(server, question_and_interruption):
    question, interruption = question_and_interruption
    aborted_before = (await _stats(server.url))["stages"]["thinker"]["counters"]["aborted"]
    client = RealtimeClient(server.url)
    await client.connect(session=SILENCE_TURNS)  # a judged pause would hold the answer up to 2 s
    try:
        # The reply is forced long and slow (the server fixture): the thinker is still writing it when its
        # first phrase starts to play and the caller talks over it.
        created = await ask(client, question, timeout=60)
        response_id = created["response"]["id"]
        started = await client.wait_event("output_audio_buffer.started", timeout=60, response_id=response_id)
        await hear(client, client.time_of(started), 0.1, timeout=30)
        client.mic.play(interruption)
        await client.wait_event("conversation.item.truncated", timeout=20, after=client.time_of(started))
        done = await client.wait_event("response.done", timeout=30)
        assert done["response"]["id"] == response_id and done["response"]["status"] == "cancelled", done
        # The interruption is a turn of its own: let its reply finish, then nothing may be held.
        await _response_done(client, await client.wait_event("response.created", timeout=60,
                                                             after=client.time_of(done)), timeout=180)
        final = await _wait_idle(server.url)
        thinker = final["stages"]["thinker"]
        assert thinker["resources"]["kv_slots"] == 0
        assert thinker["counters"]["aborted"] > aborted_before, "the barge-in must abort the reply in the thinker"
    finally:
        await client.hang_up()


async def _overlap(client: RealtimeClient, question: np.ndarray, clips: list[np.ndarray]) -> tuple[str, dict]:
    """Ask, then play each clip over the reply once 0.5 s more of it was heard (each but the last
    resumes it); the reply's id and where the last cut it (``conversation.item.truncated``)."""
    created = await ask(client, question, timeout=60)
    response_id = created["response"]["id"]
    since = client.time_of(await client.wait_event("output_audio_buffer.started", timeout=60,
                                                   response_id=response_id))
    for clip in clips[:-1]:
        await hear(client, since, 0.5, timeout=30)
        client.mic.play(clip)
        since = client.time_of(await client.wait_event("duplex.response.resumed", timeout=30, after=since,
                                                       response_id=response_id))
    await hear(client, since, 0.5, timeout=30)
    client.mic.play(clips[-1])
    return response_id, await client.wait_event("conversation.item.truncated", timeout=30, after=since)


async def test_the_barge_in_hears_the_words_uh_huh_resumes_and_sorry_with_a_pause_cuts(
        server, question_and_interruption, overlaps):
    question, _ = question_and_interruption
    uh_huh, sorry = overlaps
    # the sound alone (words off) resumes the reply in the pause after "Sorry," before the rest cuts it
    deaf = RealtimeClient(server.url)
    await deaf.connect(session={"barge_in": {"words": False}, **SILENCE_TURNS})
    try:
        response_id, _ = await _overlap(deaf, question, [sorry])
        assert [r["response_id"] for r in deaf.of_type("duplex.response.resumed")] == [response_id]
    finally:
        await deaf.hang_up()
    await _wait_idle(server.url)
    asr_before = (await _stats(server.url))["stages"]["asr"]["counters"]["admitted"]
    client = RealtimeClient(server.url)
    await client.connect(session=SILENCE_TURNS)
    try:
        response_id, cut = await _overlap(client, question, [uh_huh, sorry])
        judged = [j for j in client.of_type("duplex.overlap.judged") if j["response_id"] == response_id]
        print(f"\njudged: {judged}")
        assert [j["kind"] for j in judged][1:] == ["interruption"], judged
        resumed = [r for r in client.of_type("duplex.response.resumed") if r["response_id"] == response_id]
        assert len(resumed) == 1 and resumed[0]["transcript"] == judged[0]["transcript"]  # the uh-huh's only
        turn = await client.wait_event("conversation.item.input_audio_transcription.completed", timeout=60,
                                       after=client.time_of(cut))
        said = turn["transcript"].lower()
        assert "sorry" in said and "ask" in said, turn  # one turn from the onset: both halves
        await _response_done(client, await client.wait_event("response.created", timeout=60,
                                                             after=client.time_of(cut)), timeout=180)
        final = await _wait_idle(server.url)  # every probe ended: nothing held anywhere
        assert final["stages"]["asr"]["counters"]["admitted"] >= asr_before + 3  # 2 turns, the probes
    finally:
        await client.hang_up()

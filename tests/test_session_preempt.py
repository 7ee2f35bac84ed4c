"""Preemptive generation: a pause starts the answer early; resumed speech aborts it.

Turn detection is checked on real espeak audio (fast); the whole behaviour end to end with a real
aiortc client against `duplex serve --config toy-voice` (slow), where the toy pipeline's reply
states how many seconds of caller audio its request held, so it tells which audio it answered.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import numpy as np
import pytest

from duplex.config.session import SessionConfig, VadConfig
from duplex.session.protocol import apply_settings
from duplex.session.realtime import events as ev
from duplex.session.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetector
from duplex.session.vad import FrameClassifier
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak

pytestmark = pytest.mark.usefixtures("loopback_candidates")  # WebRTC over 127.0.0.1

RATE = 16000
PAUSE_S = 0.35  # between the two halves of the sentence: over pause_ms (200), under silence_ms (500)
REPLY = "I heard {seconds} seconds of speech."


def _gap(seconds: float, rate: int) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


def sentence_with_pause(rate: int) -> np.ndarray:
    return np.concatenate([espeak("Could you tell me", rate=rate), _gap(PAUSE_S, rate),
                           espeak("what time it is", rate=rate)])


def detect(audio: np.ndarray, pause_ms: int | None) -> list:
    config = VadConfig()
    classifier, detector = FrameClassifier(config), TurnDetector(config, pause_ms)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    events = []
    for i in range(len(pcm) // 320):
        event = detector.push(i * 20, classifier.is_voiced(pcm[i * 320:(i + 1) * 320]))
        if event is not None:
            events.append(event)
    return events


def test_a_pause_is_reported_before_the_turn_ends_and_resuming_is_reported():
    audio = np.concatenate([_gap(0.5, RATE), sentence_with_pause(RATE), _gap(1.0, RATE)])
    events = detect(audio, pause_ms=200)
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped]
    first_pause, resumed, last_pause, stopped = events[1:]
    assert resumed.at_ms - first_pause.end_ms >= 200  # the pause really was longer than pause_ms
    assert last_pause.end_ms == stopped.end_ms  # the speculation covered exactly the turn's audio
    # Without preemption the same audio gives the plain turn events.
    assert [type(e) for e in detect(audio, pause_ms=None)] == [SpeechStarted, SpeechStopped]


def test_preemption_settings_come_from_config_and_session_update():
    config = SessionConfig.model_validate({"preemptive_generation": {"enabled": True, "pause_ms": 250}})
    assert config.pause_ms == 250 and SessionConfig().pause_ms is None
    update = ev.decode_client_event(
        '{"type": "session.update", "session": {"preemptive_generation": {"enabled": false}}}')
    assert apply_settings(config, update.session).pause_ms is None
    too_long = ev.decode_client_event(
        '{"type": "session.update", "session": {"preemptive_generation": {"enabled": true, "pause_ms": 600}}}')
    with pytest.raises(ValueError, match="shorter than vad.silence_ms"):
        apply_settings(SessionConfig(), too_long.session)


# -- end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback",
                        "--session.preemptive_generation.enabled", "true", "--mind.args.reply", REPLY,
                        "--voice.args.pace", "0.6"]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


async def _stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/duplex/stats")).json()


async def _wait_idle(url: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        current = await _stats(url)
        if all(v["live_requests"] == 0 and not any(v["resources"].values()) for v in current["stages"].values()):
            return current
        assert time.monotonic() < deadline, f"stages still hold state: {current['stages']}"
        await asyncio.sleep(0.05)


def _aborted(stats: dict) -> int:
    return sum(v["counters"].get("aborted", 0) for v in stats["stages"].values())


def turn_onset_ms(client: RealtimeClient) -> int:
    """Stream time (ms) where the session heard the caller's one turn start."""
    (started,) = client.of_type("input_audio_buffer.speech_started")
    return started["audio_start_ms"]


def _heard_seconds(transcript: str) -> float:
    return float(transcript.strip("[").split()[0])


@pytest.mark.slow
async def test_a_mid_sentence_pause_aborts_the_speculation_and_one_reply_answers_it_all(server):
    # lead-in silence longer than the prefix padding, so the turn's request holds all of it
    sentence = np.concatenate([_gap(0.5, 48000), sentence_with_pause(48000)])
    client = RealtimeClient(server.url)
    await client.connect()
    aborted_before = _aborted(await _stats(server.url))
    try:
        client.mic.play(sentence)
        stopped = await client.wait_event("input_audio_buffer.speech_stopped", timeout=20)
        created = await client.wait_event("response.created", timeout=10)
        response_id = created["response"]["id"]
        await client.wait_event("output_audio_buffer.stopped", timeout=20, response_id=response_id)
        done = next(e for e in client.of_type("response.done") if e["response"]["id"] == response_id)
        assert done["response"]["status"] == "completed"

        started = client.of_type("duplex.preemptive.started")
        cancelled = client.of_type("duplex.preemptive.cancelled")
        committed = client.of_type("duplex.preemptive.committed")
        assert len(started) == 2 and len(cancelled) == 1 and len(committed) == 1, [e["type"] for _, e in client.events]
        assert cancelled[0]["request_id"] == started[0]["request_id"]
        assert committed[0]["request_id"] == started[1]["request_id"] and committed[0]["response_id"] == response_id
        # One response in all, and it answers the whole sentence: its request held the prefix
        # padding, the turn from its onset through the second pause (which spans the resume
        # point), and the pause_ms that started it. The expectation comes from the session's own
        # events, so it does not depend on how the VAD cut this voice; the tolerance is the toy
        # ears' rounding of the seconds it reports (one decimal).
        assert started[1]["audio_end_ms"] > cancelled[0]["audio_start_ms"] > started[0]["audio_end_ms"]
        assert len(client.of_type("response.created")) == 1
        transcripts = client.of_type("conversation.item.input_audio_transcription.completed")
        assert len(transcripts) == 1, transcripts
        vad, pause_ms = SessionConfig().vad, SessionConfig().preemptive_generation.pause_ms
        onset_ms = turn_onset_ms(client)
        expected = (vad.prefix_padding_ms + started[1]["audio_end_ms"] + pause_ms - onset_ms) / 1000
        assert abs(_heard_seconds(transcripts[0]["transcript"]) - expected) <= 0.05 + 1e-9, (transcripts, expected)
        # The speculative answer to the first half was never played.
        assert not client.loud_frames(since=0, until=client.time_of(stopped))
        assert client.loud_frames(since=client.time_of(stopped))

        final = await _wait_idle(server.url)
        assert _aborted(final) > aborted_before  # the runtime abort reached the stages
        session = next(iter(final["sessions"]["sessions"].values()))
        assert (session["preemptive_starts"], session["preemptive_aborts"], session["preemptive_commits"]) == (2, 1, 1)
        assert session["responses"] == 1 and session["cancelled"] == 0
    finally:
        assert await client.hang_up() == 204
    await _wait_idle(server.url)


async def _first_audio_after_speech(client: RealtimeClient, question: np.ndarray) -> tuple[float, float]:
    """Say ``question``; (client ms from its last sample sent to the first loud agent frame,
    server ttfa_ms). Waits for the reply to finish playing."""
    clip = client.mic.play(question)
    await asyncio.wait_for(clip.ended.wait(), 20)
    spoken = time.monotonic()
    created = await client.wait_event("response.created", timeout=20, after=spoken)
    response_id = created["response"]["id"]
    await client.wait_event("output_audio_buffer.stopped", timeout=20, response_id=response_id)
    first = client.loud_frames(since=spoken)[0].at
    metrics = next(e for e in client.of_type("duplex.metrics") if e["response_id"] == response_id and e.get("ttfa_ms"))
    return 1000 * (first - spoken), metrics["ttfa_ms"]


async def _set_preemption(client: RealtimeClient, enabled: bool) -> None:
    sent = time.monotonic()
    client.send({"type": "session.update", "session": {"preemptive_generation": {"enabled": enabled}}})
    updated = await client.wait_event("session.updated", after=sent)
    assert updated["session"]["preemptive_generation"]["enabled"] is enabled


@pytest.mark.slow
async def test_preemption_brings_the_reply_sooner_than_without_it(server):
    """Turns alternate between off and on in one session, so load on the box hits both alike."""
    question = espeak("Could you tell me what time it is")
    client = RealtimeClient(server.url)
    await client.connect()
    latencies: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    try:
        for enabled in (False, True) * 3:
            await _set_preemption(client, enabled)
            latencies[enabled].append(await _first_audio_after_speech(client, question))
        session = next(iter((await _stats(server.url))["sessions"]["sessions"].values()))
        assert session["preemptive_commits"] == 3 and session["preemptive_aborts"] == 0
    finally:
        await client.hang_up()
    off = statistics.median(c for c, _ in latencies[False])
    on = statistics.median(c for c, _ in latencies[True])
    print(f"\nfirst agent audio after the caller's last sample (client, median of 3): "
          f"preemption off {off:.0f} ms, on {on:.0f} ms; all {latencies}")
    # The turn still ends after 500 ms of silence either way; with preemption the pipeline's own
    # latency (transcript -> reply -> first voiced word, ~100+ ms here) is already spent by then.
    assert on < off - 50, latencies
    await _wait_idle(server.url)

"""Every model behind a server, through the session: ``duplex serve --config services --asr
tcp://... --tts tcp://... --llm ...`` with real Wyoming servers for the ears and the voice
(wyoming-faster-whisper, wyoming-piper; scripts/setup_speech.sh) and a tiny fake engine for the
thinker (it streams " la" until the client hangs up: a reply long enough to barge into), talked
to over the Realtime WebSocket with the official ``openai`` SDK.

A spoken order is transcribed by the ASR server and answered with the TTS server's audio; a
spoken interruption closes the reply's TTS stream (the server's stats); an unknown voice is an
``error`` event naming the voices offered; a TTS server killed mid-reply is the caller's
``error``, and once it is back the next reply is voiced again. No assertion depends on this
CPU's speed: waits are bounded polls on the server's own events and stats."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from duplex.models.local import assets
from duplex_tools.harness import ServerProcess, server_stats
from duplex_tools.speech_servers import WyomingServer, speech_available
from duplex_tools.ws_client import RATE, WsCaller
from tests.engine_helpers import TinyEngine
from tests.local_helpers import INTERRUPTION, ORDER, speak, word_recall
from tests.tts_checks import serve_answers_an_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def stack():
    missing = speech_available()
    if missing:
        pytest.fail(missing)
    with WyomingServer.whisper(assets.prepare_whisper()) as whisper, WyomingServer.piper() as piper, \
            TinyEngine() as engine:
        args = ["--config", "services", "--asr", whisper.url, "--tts", piper.url, "--llm", engine.url("trickle"),
                "--llm-model", "tiny", "--port", "0", "--max-sessions", "2"]
        with ServerProcess(args, ready_timeout=120) as proc:
            yield proc, piper, engine, whisper
        assert proc.stop() == 0, "".join(proc.output[-30:])


@pytest.fixture(scope="module")
def voices() -> dict[str, np.ndarray]:
    # made before any call: synthesis inside a test would stall the client's event loop
    return {"order": np.concatenate([speak(ORDER, rate=RATE), np.zeros(RATE, np.float32)]),
            "stop": speak(INTERRUPTION, rate=RATE), "wait": speak("Wait, stop.", rate=RATE)}


async def _tts_streams(url: str) -> int:
    stats = await asyncio.to_thread(server_stats, url)
    return stats["stages"]["tts"]["resources"]["open_streams"]


async def _poll(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        await asyncio.sleep(0.05)


async def _audio_of(caller: WsCaller, response_id: str, timeout: float) -> None:
    await caller.wait("response.output_audio.delta", timeout=timeout, response_id=response_id)


async def test_a_spoken_order_is_answered_and_a_barge_in_closes_the_tts_stream(stack, voices):
    proc, _, engine, _ = stack
    async with WsCaller(proc.url) as caller:
        await caller.conn.session.update(session={"type": "realtime", "barge_in": {"mode": "onset"}})
        await caller.wait("session.updated")
        caller.say(voices["order"])
        heard = await caller.wait("conversation.item.input_audio_transcription.completed", timeout=60)
        assert word_recall(ORDER, heard.transcript) >= 0.8, heard.transcript
        response = (await caller.wait("response.created", timeout=60)).response
        await _audio_of(caller, response.id, timeout=60)
        await _poll(lambda: _is(_tts_streams(proc.url), 1), 10, "the reply's tts stream open")
        caller.say(voices["stop"])
        done = await caller.wait("response.done", timeout=30, after=time.monotonic() - 60)
        assert done.response.id == response.id and done.response.status == "cancelled", done
        cut = caller.time_of(done)
        # the cut reply's stream is closed; the interruption's own reply may open the next one
        await _poll(lambda: _closed_since(proc.url, caller, cut), 5, "the cut reply's tts stream closed")
        await _poll(lambda: _true(engine.disconnected.is_set()), 5, "the engine's stream for the cut reply closed")


async def _true(value: bool) -> bool:
    return value


async def test_the_listening_barge_in_hears_the_overlap_through_the_asr_server(stack, voices):
    """Barge-in in ``listen`` mode: the reply pauses, the overlap goes to the ASR server as an
    ``OverlapProbe``, and its words decide. The sound alone may not decide here (interrupt_ms
    longer than the overlap; words waited for up to 5 s: a hang guard, not a speed)."""
    proc, _, _, _ = stack
    async with WsCaller(proc.url) as caller:
        await caller.conn.session.update(session={"type": "realtime", "barge_in": {
            "mode": "listen", "interrupt_ms": 5000, "max_overlap_ms": 10000, "words_wait_ms": 5000}})
        await caller.wait("session.updated")
        caller.say(voices["order"])
        response = (await caller.wait("response.created", timeout=60)).response
        await _audio_of(caller, response.id, timeout=60)
        caller.say(voices["wait"])
        judged = await caller.wait("duplex.overlap.judged", timeout=30, response_id=response.id)
        assert judged.kind == "interruption" and judged.decided_by == "words", judged
        assert word_recall(judged.transcript, "Wait, stop.") == 1.0, judged  # its words (all or the first) were said
        done = await caller.wait("response.done", timeout=30, after=caller.time_of(judged) - 1)
        assert done.response.id == response.id and done.response.status == "cancelled", done


async def _is(value, expected: int) -> bool:
    return await value == expected


async def _closed_since(url: str, caller: WsCaller, cut: float) -> bool:
    """No tts stream is open, or the one open belongs to a reply created after the cut."""
    streams = await _tts_streams(url)
    later = [e for at, e in caller.events if at > cut and e.type == "response.created"]
    return streams == 0 or (streams == 1 and bool(later))


async def test_an_unknown_voice_is_an_error_naming_the_voices_offered(stack):
    proc, _, _, _ = stack
    async with WsCaller(proc.url, stream=False) as caller:
        await caller.conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}})
        updated = await caller.wait("session.updated")
        assert updated.session.audio.output.voice == "nobody"
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Hello?"}]})
        await caller.conn.response.create()
        error = await caller.wait("error", timeout=30)
        assert "nobody" in error.error.message and "en_US-joe-medium" in error.error.message, error


async def test_a_mix_local_asr_engine_thinker_and_a_tts_server(stack):
    """``--config engine --tts tcp://...``: Whisper in process, the engine's thinker, Piper on its server."""
    _, piper, engine, _ = stack
    await serve_answers_an_order(["--config", "engine", "--tts", piper.url, "--llm", engine.url("ok"),
                                  "--llm-model", "tiny"])


async def test_an_asr_server_killed_mid_turn_is_an_error_and_the_next_turn_is_heard(stack, voices):
    proc, _, _, whisper = stack
    async with WsCaller(proc.url) as caller:
        caller.say(voices["order"][: RATE])  # the first second of the order: the turn is open
        await caller.wait("input_audio_buffer.speech_started", timeout=30)
        await asyncio.to_thread(whisper.kill)
        caller.say(voices["order"][RATE:])
        error = await caller.wait("error", timeout=60)
        assert whisper.url in error.error.message, error
        await asyncio.to_thread(whisper.start)
        sent = time.monotonic()
        caller.say(voices["order"])
        heard = await caller.wait("conversation.item.input_audio_transcription.completed", timeout=60, after=sent)
        assert word_recall(ORDER, heard.transcript) >= 0.8, heard.transcript


async def test_a_tts_server_killed_mid_reply_is_an_error_and_the_next_reply_is_voiced(stack):
    proc, piper, _, _ = stack
    async with WsCaller(proc.url, stream=False) as caller:
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Hello?"}]})
        await caller.conn.response.create()
        first = (await caller.wait("response.created", timeout=30)).response
        await _audio_of(caller, first.id, timeout=60)
        await asyncio.to_thread(piper.kill)
        error = await caller.wait("error", timeout=30)
        assert piper.url in error.error.message, error
        await asyncio.to_thread(piper.start)
        await caller.conn.response.cancel()
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Are you there?"}]})
        sent = time.monotonic()
        await caller.conn.response.create()
        second = (await caller.wait("response.created", timeout=30, after=sent)).response
        await _audio_of(caller, second.id, timeout=60)

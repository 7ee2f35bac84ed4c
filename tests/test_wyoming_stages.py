"""The ``wyoming`` stages against real Wyoming servers (wyoming-faster-whisper on the Whisper-base
folder, wyoming-piper on the packaged joe voice; scripts/setup_speech.sh installs them in a venv
of their own), then against a fake server that misbehaves on purpose (refused, stalled, garbage,
a rate no one can play, a hang-up). The servers are killed and restarted by the last tests: keep
them last.

No assertion depends on how fast this CPU is: waits are bounded polls, timeouts hang guards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from duplex.audio import resample
from duplex.config.pipeline import StageConfig
from duplex.models.local import assets
from duplex.models.speech.asr import ASRSettings, WyomingASR
from duplex.models.speech.client import Endpoint, ServiceError, parse_url
from duplex.models.speech.tts import TTSSettings, WyomingTTS
from duplex.runtime.contract import (
    AgentAudio,
    AgentText,
    CallerAudio,
    OverlapProbe,
    Transcript,
    TurnRequest,
    WorkItem,
)
from duplex.runtime.schedulers.stream import StreamScheduler
from duplex_tools.speech_servers import WyomingServer, free_port, speech_available
from tests.local_helpers import ORDER, caller_audio, chunks, silence, speak, wait_until, word_recall
from tests.speech_fakes import FakeWyoming
from tests.tts_checks import abort_closes_the_stream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPLY = ["Sure,", " one", " large", " taro", " milk", " tea.", " Anything", " else?"]


@pytest.fixture(scope="module")
def whisper():
    missing = speech_available()
    if missing:
        pytest.fail(missing)
    with WyomingServer.whisper(assets.prepare_whisper()) as server:
        yield server


@pytest.fixture(scope="module")
def piper():
    missing = speech_available()
    if missing:
        pytest.fail(missing)
    with WyomingServer.piper() as server:
        yield server


def _asr(url: str, **settings) -> WyomingASR:
    return WyomingASR(parse_url(url, "asr server"), ASRSettings(**settings))


def _tts(url: str, **settings) -> WyomingTTS:
    return WyomingTTS(parse_url(url, "tts server"), TTSSettings(**settings))


async def _text(request: TurnRequest, deltas: list[str], rid: str = "r1") -> AsyncIterator[WorkItem]:
    for n, delta in enumerate(deltas):
        yield WorkItem(rid, "thinker", AgentText(delta), n == len(deltas) - 1, request)


async def _audio(request, pieces: list[CallerAudio], rid: str = "r1") -> AsyncIterator[WorkItem]:
    for n, piece in enumerate(pieces):
        yield WorkItem(rid, "client", piece, n == len(pieces) - 1, request)


def _speech(text: str, pause_s: float = 0.0) -> list[CallerAudio]:
    audio = np.concatenate([silence(0.2), speak(text), silence(0.4 + pause_s)])
    return caller_audio(chunks(audio))


async def _collect(gen: AsyncIterator) -> list:
    return [item async for item in gen]


# -- the real servers ------------------------------------------------------------------------
async def test_piper_voices_a_streamed_reply_chunk_by_chunk(piper):
    tts = _tts(piper.url)
    request = TurnRequest(session_id="s1")
    out = await _collect(tts.run("r1", request, _text(request, REPLY)))
    assert out and all(isinstance(o, AgentAudio) and o.sample_rate == 22050 for o in out)
    voiced = [o.text for o in out if o.text]
    assert voiced[0] == "Sure," and "".join(voiced) == "".join(REPLY)  # each phrase once, on its first chunk
    assert len(out) > len(voiced), "the audio should come in chunks, not one piece per phrase"
    assert tts.held() == {"open_streams": 0}


async def test_whisper_hears_what_piper_said(whisper, piper):
    request = TurnRequest(session_id="s2")
    audio = await _collect(_tts(piper.url).run("r1", request, _text(request, [ORDER])))
    speech = resample(np.concatenate([a.samples for a in audio]), audio[0].sample_rate, 16000)
    asr = _asr(whisper.url)
    pieces = caller_audio(chunks(np.concatenate([silence(0.2), speech, silence(0.1)])))
    out = await _collect(asr.run("r2", request, _audio(request, pieces)))
    assert isinstance(out[-1], Transcript) and out[-1].final
    assert word_recall(ORDER, out[-1].text) >= 0.85, out[-1].text
    assert asr.held()["open_streams"] == 0


async def test_a_pause_gets_a_speculative_final_that_the_end_of_turn_reuses(whisper):
    asr = _asr(whisper.url, settle_s=0.2)
    request = TurnRequest(session_id="s3")
    out = await _collect(asr.run("r3", request, _audio(request, _speech(ORDER, pause_s=0.3))))
    interim = [o for o in out if not o.final]
    assert len(interim) == 1 and out[-1].final and out[-1].text == interim[0].text
    assert word_recall(ORDER, out[-1].text) >= 0.85
    assert asr.calls == 1, "the end of the turn found nothing new said: no second transcription"


async def test_an_overlap_probe_is_transcribed_like_a_turn(whisper):
    asr = _asr(whisper.url)
    probe = OverlapProbe(session_id="s4")
    out = await _collect(asr.run("p1", probe, _audio(probe, _speech("Wait, stop."))))
    assert out[-1].final and word_recall("wait stop", out[-1].text) >= 0.5


async def test_typed_and_silent_turns_ask_no_server():
    asr = _asr(f"tcp://127.0.0.1:{free_port()}")  # nothing listens there
    typed = TurnRequest(session_id="s5", text="A taro tea.")
    assert await _collect(asr.run("t1", typed, _audio(typed, [CallerAudio(silence(0.02), [False])]))) == \
        [Transcript("A taro tea.", final=True)]
    quiet = TurnRequest(session_id="s5")
    assert await _collect(asr.run("t2", quiet, _audio(quiet, caller_audio(chunks(silence(1.0)))))) == \
        [Transcript("", final=True)]
    assert asr.calls == 0


async def test_an_unknown_voice_is_refused_naming_the_voices_offered(piper):
    tts = _tts(piper.url)
    request = TurnRequest(session_id="s6", voice="nobody-at-all")
    with pytest.raises(ValueError, match="en_US-joe-medium") as refused:
        await _collect(tts.run("r1", request, _text(request, REPLY)))
    assert "nobody-at-all" in str(refused.value)
    chosen = TurnRequest(session_id="s6", voice="en_US-joe-medium")
    assert await _collect(tts.run("r2", chosen, _text(chosen, ["Hello."])))


async def test_an_abort_closes_the_tts_stream_at_once(piper):
    await abort_closes_the_stream("wyoming.tts", _tts(piper.url), open_at_first_audio=True)


async def test_an_aborted_turn_closes_its_asr_connections():
    """A turn aborted while its audio streams (the caller hung up, a barge-in): nothing stays open."""
    with FakeWyoming("stall") as fake:
        stage = StageConfig(name="asr", builder="wyoming.asr", scheduler="stream")
        scheduler = StreamScheduler(stage, _asr(fake.url))
        scheduler.start()
        try:
            request = TurnRequest(session_id="s8")
            for piece in _speech("Hello there.", pause_s=0.3):  # a pause: a speculative connection too
                scheduler.inbox.put(WorkItem("rb", "client", piece, False, request))
            wait_until(lambda: fake.accepted >= 2, timeout=10, what="the streamed and the speculative connection")
            scheduler.abort("rb")
            wait_until(lambda: fake.open_connections == 0, timeout=5, what="the fake's connections closed")
            wait_until(lambda: not scheduler.live_requests(), timeout=5, what="the request ended")
            assert scheduler.resources()["open_streams"] == 0
        finally:
            scheduler.stop()


# -- faults: a fake server that misbehaves -----------------------------------------------------
@pytest.mark.parametrize("mode, words", [("stall", "stalled"), ("garbage", "not a Wyoming event"),
                                         ("rate", "cannot play"), ("hangup", "hung up|closed the connection")])
async def test_a_misbehaving_tts_server_fails_the_request_clearly(mode, words):
    with FakeWyoming(mode) as fake:
        tts = _tts(fake.url, stall_timeout_s=0.5)
        request = TurnRequest(session_id="f1")
        started = time.monotonic()
        with pytest.raises(ServiceError, match=words) as failed:
            await _collect(tts.run("r1", request, _text(request, REPLY)))
        assert time.monotonic() - started < 5.0 and fake.url in str(failed.value)
        assert tts.held()["open_streams"] == 0
        wait_until(lambda: fake.open_connections == 0, timeout=5, what="the fake's connections closed")


@pytest.mark.parametrize("mode, words", [("stall", "stalled"), ("garbage", "not a Wyoming event"),
                                         ("hangup", "hung up|closed the connection")])
async def test_a_misbehaving_asr_server_fails_the_request_clearly(mode, words):
    with FakeWyoming(mode) as fake:
        asr = _asr(fake.url, stall_timeout_s=0.5, transcript_timeout_s=0.5)
        request = TurnRequest(session_id="f2")
        with pytest.raises(ServiceError, match=words):
            await _collect(asr.run("r1", request, _audio(request, _speech("Hello there."))))
        assert asr.held()["open_streams"] == 0
        wait_until(lambda: fake.open_connections == 0, timeout=5, what="the fake's connections closed")


async def test_a_refused_connection_names_the_server():
    url = f"tcp://127.0.0.1:{free_port()}"
    request = TurnRequest(session_id="f3")
    with pytest.raises(ServiceError, match="refused the connection"):
        await _collect(_tts(url).run("r1", request, _text(request, REPLY)))
    with pytest.raises(ServiceError, match="refused the connection"):
        await _collect(_asr(url).run("r2", request, _audio(request, _speech("Hello there."))))


def test_http_urls_are_refused_as_not_wyoming():
    with pytest.raises(ValueError, match="openai.tts"):
        parse_url("http://127.0.0.1:8000/v1", "--tts")
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        parse_url("127.0.0.1:10200", "--asr")
    assert parse_url("tcp://127.0.0.1:10200", "--asr") == Endpoint("127.0.0.1", 10200, "--asr")


# -- servers that die mid-utterance (kills the module's servers: keep these last) ----------------
async def test_the_asr_server_dying_mid_turn_fails_it_and_the_next_turn_works(whisper):
    asr = _asr(whisper.url, connect_timeout_s=1.0)
    pieces = _speech(ORDER)
    half = len(pieces) // 2

    async def turn(rid: str, between) -> list:
        request = TurnRequest(session_id="d1")

        async def inputs() -> AsyncIterator[WorkItem]:
            async for item in _audio(request, pieces, rid):
                if item.data is pieces[half]:
                    await asyncio.to_thread(between)
                yield item
        return await _collect(asr.run(rid, request, inputs()))

    with pytest.raises(ServiceError, match="refused the connection"):
        await turn("r1", whisper.kill)  # died, not back by the end of the turn: the caller's error
    await asyncio.to_thread(whisper.start)
    out = await turn("r2", lambda: None)
    assert word_recall(ORDER, out[-1].text) >= 0.85
    # died and came back within the turn: the final is asked again with the whole audio
    out = await turn("r3", lambda: (whisper.kill(), whisper.start()))
    assert word_recall(ORDER, out[-1].text) >= 0.85, out[-1].text
    assert asr.held()["open_streams"] == 0


async def test_the_tts_server_dying_mid_reply_fails_it_and_the_next_reply_works(piper):
    tts = _tts(piper.url, connect_timeout_s=1.0)
    request = TurnRequest(session_id="d2")

    async def slow_text() -> AsyncIterator[WorkItem]:
        yield WorkItem("r1", "thinker", AgentText("Sure, one large taro milk tea."), False, request)
        await asyncio.to_thread(wait_until, lambda: tts.held()["open_streams"] == 1, 30, "the stream open")
        await asyncio.to_thread(piper.kill)
        yield WorkItem("r1", "thinker", AgentText(" Anything else for you today?"), True, request)

    with pytest.raises(ServiceError, match="hung up|closed the connection"):
        await _collect(tts.run("r1", request, slow_text()))
    assert tts.held()["open_streams"] == 0
    await asyncio.to_thread(piper.start)
    assert await _collect(tts.run("r2", request, _text(request, REPLY, "r2")))

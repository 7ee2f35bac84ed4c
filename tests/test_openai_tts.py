"""The OpenAI-compatible TTS stage (``openai.tts``: ``POST /v1/audio/speech``) against a real
server, local-tts-studio speaking with the packaged Piper joe voice (scripts/setup_speech.sh
installs it; started with its API key check on), then against a fake that misbehaves on purpose
(stalled, garbage, not a WAV, a rate no one can play, a hang-up mid-answer, an error status, a
voice it does not list), then through the session: ``duplex serve --tts http://...``. The server
is killed and restarted by the last test: keep it last.

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
from duplex.models.speech.client import ServiceError
from duplex.models.speech.openai_tts import OpenAITTS, SpeechFormat
from duplex.models.speech.phrasing import TTSSettings
from duplex.runtime.contract import AgentAudio, AgentText, TurnRequest, WorkItem
from duplex.runtime.schedulers.stream import StreamScheduler
from duplex_tools.speech_servers import STUDIO_KEY, WyomingServer, free_port, speech_available
from tests.engine_helpers import TinyEngine
from tests.local_helpers import wait_until, word_recall
from tests.speech_fakes import FakeSpeech
from tests.test_wyoming_stages import REPLY, _collect, _text
from tests.tts_checks import abort_closes_the_stream, serve_answers_an_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PIPER_RATE = 22050  # the joe voice's; local-tts-studio's pcm is at the voice's rate, its wav says so


@pytest.fixture(scope="module")
def studio():
    missing = speech_available()
    if missing:
        pytest.fail(missing)
    with WyomingServer.openai_piper(start_timeout_s=120) as server:
        yield server


def _tts(url: str, key: str = STUDIO_KEY, fmt: str = "wav", **settings) -> OpenAITTS:
    return OpenAITTS(url, key, TTSSettings(**settings), SpeechFormat(response_format=fmt, pcm_rate=PIPER_RATE))


def _heard(audio: list[AgentAudio]) -> str:
    """What Whisper-base hears in the stage's audio (the in-process faster-whisper, int8)."""
    from faster_whisper import WhisperModel

    speech = resample(np.concatenate([a.samples for a in audio]), audio[0].sample_rate, 16000)
    model = WhisperModel(str(assets.prepare_whisper()), device="cpu", compute_type="int8", cpu_threads=1)
    segments, _ = model.transcribe(speech, language="en", beam_size=1)
    return " ".join(segment.text for segment in segments)


# -- the real server ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["wav", "pcm"])
async def test_piper_behind_the_openai_api_voices_a_reply_phrase_by_phrase(studio, fmt):
    tts = _tts(studio.url, fmt=fmt)
    request = TurnRequest(session_id="o1")
    out = await _collect(tts.run("r1", request, _text(request, REPLY)))
    assert out and all(isinstance(o, AgentAudio) and o.sample_rate == PIPER_RATE for o in out)
    voiced = [o.text for o in out if o.text]
    assert voiced[0] == "Sure," and "".join(voiced) == "".join(REPLY)  # each phrase once, on its first chunk
    # Piper samples its noise inside the model, so each take differs; Whisper-base hears "taro milk
    # tea" only in some ("tarot mocty"): the plain words say the audio is this reply at its rate
    assert word_recall("Sure one large anything else", _heard(out)) >= 0.8
    assert tts.held() == {"open_streams": 0}


async def test_a_wrong_key_is_refused_with_the_servers_message(studio):
    request = TurnRequest(session_id="o2")
    with pytest.raises(ServiceError, match="HTTP 401: .*API key") as refused:
        await _collect(_tts(studio.url, key="wrong").run("r1", request, _text(request, REPLY)))
    assert studio.url in str(refused.value)


async def test_a_voice_goes_through_where_the_server_lists_none(studio):
    tts = _tts(studio.url)
    assert await tts.voices() is None  # local-tts-studio has no voice list under /v1
    request = TurnRequest(session_id="o3", voice="nova")  # it speaks with the voice it is set to
    assert await _collect(tts.run("r1", request, _text(request, ["Hello."])))


async def test_an_abort_closes_the_tts_stream_at_once(studio):
    await abort_closes_the_stream("openai.tts", _tts(studio.url))


async def test_an_abort_mid_answer_closes_the_connection_the_server_streams_into():
    """A response still streaming when the barge-in comes: its connection is closed at once."""
    with FakeSpeech("stall") as fake:
        stage = StageConfig(name="tts", builder="openai.tts", scheduler="stream")
        scheduler = StreamScheduler(stage, _tts(fake.url, fmt="pcm"))
        scheduler.start()
        try:
            request = TurnRequest(session_id="o5")
            scheduler.inbox.put(WorkItem("rb", "thinker", AgentText("Sure, one large taro milk tea."), True, request))
            deadline = time.monotonic() + 30
            while not any(isinstance(e.data, AgentAudio) for e in scheduler.outbox.drain()):
                assert time.monotonic() < deadline, "no audio from the fake"
                await asyncio.sleep(0.01)
            assert scheduler.resources()["open_streams"] == 1 and fake.open_connections == 1
            aborted = time.monotonic()
            scheduler.abort("rb")
            wait_until(lambda: fake.open_connections == 0, timeout=5, what="the fake's connection closed")
            assert time.monotonic() - aborted < 1.0
            assert scheduler.resources()["open_streams"] == 0
        finally:
            scheduler.stop()


# -- faults: a fake server that misbehaves -----------------------------------------------------
@pytest.mark.parametrize("mode, fmt, words", [
    ("stall", "pcm", "stalled"), ("garbage", "pcm", "not audio"), ("notwav", "wav", "not a WAV"),
    ("rate", "wav", "cannot play"), ("hangup", "pcm", "hung up mid-answer"),
    ("status500", "pcm", "HTTP 500: .*the fake is broken")])
async def test_a_misbehaving_tts_server_fails_the_request_clearly(mode, fmt, words):
    with FakeSpeech(mode) as fake:
        tts = _tts(fake.url, fmt=fmt, stall_timeout_s=0.5)
        request = TurnRequest(session_id="f1")
        started, heard = time.monotonic(), []
        with pytest.raises(ServiceError, match=words) as failed:
            async for audio in tts.run("r1", request, _text(request, REPLY)):
                heard.append(audio)
        assert time.monotonic() - started < 5.0 and fake.url in str(failed.value)
        assert fake.requests[0] == {"model": "tts-1", "input": "Sure,", "voice": "alloy", "response_format": fmt}
        assert tts.held()["open_streams"] == 0
        if mode in ("stall", "hangup"):  # faults mid-answer: what came before was played as it came ...
            assert heard and heard[0].text == "Sure," and heard[0].sample_rate == PIPER_RATE
            # ... and the connection is not kept (a whole answer's may wait in the client's pool)
            wait_until(lambda: fake.open_connections == 0, timeout=5, what="the fake's connection closed")


async def test_an_unknown_voice_is_refused_naming_the_voices_listed():
    """A server that lists its voices (``GET /audio/voices``, as Kokoro-FastAPI does)."""
    with FakeSpeech("voices") as fake:
        tts = _tts(fake.url, fmt="pcm")
        request = TurnRequest(session_id="f2", voice="nobody-at-all")
        with pytest.raises(ValueError, match="af_bella, am_adam") as refused:
            await _collect(tts.run("r1", request, _text(request, REPLY)))
        assert "nobody-at-all" in str(refused.value) and not fake.requests
        chosen = TurnRequest(session_id="f2", voice="am_adam")
        assert await _collect(tts.run("r2", chosen, _text(chosen, ["Hello."])))
        assert fake.requests[0]["voice"] == "am_adam"


async def test_a_refused_connection_names_the_server():
    url = f"http://127.0.0.1:{free_port()}/v1"
    request = TurnRequest(session_id="f3")
    with pytest.raises(ServiceError, match="refused the connection") as refused:
        await _collect(_tts(url).run("r1", request, _text(request, REPLY)))
    assert url in str(refused.value)


# -- through the session -----------------------------------------------------------------------
async def test_serve_with_an_openai_tts_server(studio, monkeypatch):
    """``duplex serve --config engine --tts http://...``: the engine's thinker, Whisper in process."""
    monkeypatch.setenv("DUPLEX_TTS_API_KEY", STUDIO_KEY)  # the server process inherits it
    with TinyEngine() as engine:
        await serve_answers_an_order(["--config", "engine", "--tts", studio.url, "--tts.args.response_format", "wav",
                                      "--llm", engine.url("ok"), "--llm-model", "tiny"])


# -- a server that dies mid-reply (kills the module's server: keep this last) -------------------
async def test_the_tts_server_dying_mid_reply_fails_it_and_the_next_reply_works(studio):
    tts = _tts(studio.url, connect_timeout_s=1.0)
    request = TurnRequest(session_id="d1")

    async def dying_text() -> AsyncIterator[WorkItem]:
        yield WorkItem("r1", "thinker", AgentText("Sure, one large taro milk tea."), False, request)
        await asyncio.to_thread(studio.kill)
        yield WorkItem("r1", "thinker", AgentText(" Anything else for you today?"), True, request)

    with pytest.raises(ServiceError, match="refused the connection|hung up"):
        await _collect(tts.run("r1", request, dying_text()))
    assert tts.held()["open_streams"] == 0
    await asyncio.to_thread(studio.start)
    assert await _collect(tts.run("r2", request, _text(request, REPLY, "r2")))

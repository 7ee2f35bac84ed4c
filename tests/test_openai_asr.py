"""The OpenAI-compatible ASR stage (``openai.asr``: ``POST /v1/audio/transcriptions``) against a
real faster-whisper-server on the Whisper-base folder (scripts/setup_speech.sh installs it), then
against a fake that misbehaves, then through the session: ``duplex serve --asr http://...``.
The server is killed and restarted by the last in-process test: keep it after the others.

No assertion depends on how fast this CPU is: waits are bounded, timeouts hang guards."""

from __future__ import annotations

import time

import numpy as np
import pytest

from duplex.models.local import assets
from duplex.models.speech.asr import ASRSettings
from duplex.models.speech.client import ServiceError
from duplex.models.speech.openai_asr import OpenAIASR
from duplex.runtime.contract import TurnRequest
from duplex_tools.harness import ServerProcess
from duplex_tools.speech_servers import WyomingServer, free_port, speech_available
from duplex_tools.ws_client import RATE, WsCaller
from tests.engine_helpers import TinyEngine
from tests.local_helpers import ORDER, speak, word_recall
from tests.speech_fakes import FakeTranscriptions
from tests.test_wyoming_stages import _audio, _collect, _speech

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server():
    missing = speech_available()
    if missing:
        pytest.fail(missing)
    with WyomingServer.openai_whisper(assets.prepare_whisper(), start_timeout_s=180) as running:
        yield running


def _asr(url: str, **settings) -> OpenAIASR:
    return OpenAIASR(url, "whisper-1", "none", ASRSettings(**settings))


async def test_a_turn_is_transcribed_with_a_speculative_final_at_its_pause(server):
    asr = _asr(server.url, settle_s=0.2)
    request = TurnRequest(session_id="o1")
    out = await _collect(asr.run("r1", request, _audio(request, _speech(ORDER, pause_s=0.3))))
    assert out[-1].final and word_recall(ORDER, out[-1].text) >= 0.85, out
    assert [o.text for o in out if not o.final] == [out[-1].text]  # the pause's, reused as the final
    assert asr.calls == 1 and asr.held()["open_streams"] == 0
    # the server's confidence comes with the words (verbose_json): a clear order is heard surely
    assert out[-1].avg_logprob is not None and -1.0 < out[-1].avg_logprob <= 0, out[-1]
    assert out[-1].no_speech_prob is not None and 0 <= out[-1].no_speech_prob < 0.5, out[-1]


async def test_a_server_that_refuses_verbose_json_is_asked_for_json_from_then_on():
    with FakeTranscriptions("json_only") as fake:
        asr = _asr(fake.url)
        for turn in ("t1", "t2"):
            request = TurnRequest(session_id="o4")
            out = await _collect(asr.run(turn, request, _audio(request, _speech("Hello there."))))
            assert out[-1].final and out[-1].text == fake.TEXT
            assert out[-1].avg_logprob is None and out[-1].no_speech_prob is None  # no confidence: all words count
        assert fake.formats == ["verbose_json", "json", "json"]
        assert asr.held()["open_streams"] == 0


@pytest.mark.parametrize("mode, words", [("stall", "stalled"), ("garbage", "not a transcription"),
                                         ("status500", "HTTP 500: .*the fake is broken")])
async def test_a_misbehaving_server_fails_the_turn_clearly(mode, words):
    with FakeTranscriptions(mode) as fake:
        asr = _asr(fake.url, transcript_timeout_s=0.5)
        request = TurnRequest(session_id="o2")
        started = time.monotonic()
        with pytest.raises(ServiceError, match=words) as failed:
            await _collect(asr.run("r1", request, _audio(request, _speech("Hello there."))))
        assert fake.url in str(failed.value) and time.monotonic() - started < 10
        assert asr.held()["open_streams"] == 0


async def test_a_refused_connection_and_a_server_back_again(server):
    request = TurnRequest(session_id="o3")
    dead = _asr(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(ServiceError, match="refused the connection"):
        await _collect(dead.run("r1", request, _audio(request, _speech("Hello there."))))
    asr = _asr(server.url)
    server.kill()
    with pytest.raises(ServiceError, match="refused the connection"):
        await _collect(asr.run("r2", request, _audio(request, _speech("Hello there."))))
    server.start()
    out = await _collect(asr.run("r3", request, _audio(request, _speech(ORDER))))
    assert word_recall(ORDER, out[-1].text) >= 0.85


async def test_serve_with_an_openai_asr_server(server):
    """``duplex serve --config engine --asr http://...``: the engine's thinker, Piper in process."""
    order = np.concatenate([speak(ORDER, rate=RATE), np.zeros(RATE, np.float32)])
    with TinyEngine() as engine, ServerProcess(
            ["--config", "engine", "--asr", server.url, "--llm", engine.url("ok"), "--llm-model", "tiny",
             "--port", "0", "--max-sessions", "1"], ready_timeout=300) as proc:
        async with WsCaller(proc.url) as caller:
            caller.say(order)
            heard = await caller.wait("conversation.item.input_audio_transcription.completed", timeout=60)
            assert word_recall(ORDER, heard.transcript) >= 0.8, heard.transcript
            response = (await caller.wait("response.created", timeout=60)).response
            await caller.wait("response.output_audio.delta", timeout=60, response_id=response.id)
        assert proc.stop() == 0, "".join(proc.output[-30:])

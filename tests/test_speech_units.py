"""The speech services' wiring without servers: ``duplex serve --asr/--tts`` turn any bundled
pipeline's asr / tts stage into a ``wyoming`` stage or, for ``http(s)://``, an ``openai`` one (or only
set the URL of one that is), URLs are checked, builders name what is missing, and the session's
``voice`` setting reaches the turn's request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from duplex.config import ConfigError
from duplex.config.session import SessionConfig
from duplex.models.speech.openai_tts import voice_names
from duplex.models.speech.stages import build_asr, build_openai_tts, build_tts
from duplex.runtime.contract import BuildContext
from duplex.server.speech_flags import load_with_servers
from duplex.session.protocol import apply_settings
from duplex.session.realtime.client_events import AudioOutput, AudioSettings, SessionSettings

ASR, TTS = "tcp://127.0.0.1:10300", "tcp://127.0.0.1:10200"


def _stages(pipeline) -> dict:
    return {stage.name: stage for stage in pipeline.stages}


def test_the_flags_put_speech_servers_into_a_bundled_pipeline():
    stages = _stages(load_with_servers("engine", ["--thinker.args.model", "m"], None, TTS))
    assert stages["asr"].builder == "local.asr"  # mixes: the local ASR, the engine thinker, a TTS server
    assert stages["thinker"].builder == "engine.thinker" and stages["thinker"].stream_to == ["tts"]
    tts = stages["tts"]
    assert tts.builder == "wyoming.tts" and tts.args == {"url": TTS} and tts.scheduler.kind == "stream"
    assert tts.terminal
    stages = _stages(load_with_servers("local", [], ASR, None))
    assert stages["asr"].builder == "wyoming.asr" and stages["asr"].stream_to == ["thinker"]
    assert stages["thinker"].builder == "local.thinker" and stages["tts"].builder == "local.tts"


def test_the_services_pipeline_only_gets_the_urls():
    stages = _stages(load_with_servers("services", [], ASR, TTS))
    assert stages["asr"].args["url"] == ASR and stages["asr"].args["settle_s"] == 0.1  # its own args kept
    assert stages["tts"].args["url"] == TTS and stages["tts"].args["clause_words"] == 4


@pytest.mark.parametrize("asr, tts, words", [(None, "127.0.0.1:10200", "expected tcp://HOST:PORT"),
                                              (None, "ftp://speech.example/v1", "or http"),
                                              ("127.0.0.1:10300", None, "expected tcp://HOST:PORT"),
                                              ("tcp://127.0.0.1", None, "expected tcp://HOST:PORT")])
def test_bad_urls_are_refused_naming_the_flag(asr, tts, words):
    with pytest.raises(ValueError, match=words) as refused:
        load_with_servers("local", [], asr, tts)
    assert ("--asr" if asr else "--tts") in str(refused.value)


def test_an_http_asr_is_the_openai_compatible_stage():
    stages = _stages(load_with_servers("local", ["--asr.args.model", "whisper-base"], "http://10.0.0.7:8000/v1", None))
    assert stages["asr"].builder == "openai.asr"
    assert stages["asr"].args == {"url": "http://10.0.0.7:8000/v1", "model": "whisper-base"}


def test_an_http_tts_is_the_openai_compatible_stage():
    url = "http://10.0.0.7:8000/v1"
    stages = _stages(load_with_servers("local", ["--tts.args.response_format", "wav"], None, url))
    assert stages["tts"].builder == "openai.tts" and stages["tts"].scheduler.kind == "stream"
    assert stages["tts"].args == {"url": url, "response_format": "wav"} and stages["tts"].terminal
    stages = _stages(load_with_servers("services", [], None, "https://speech.example/v1"))
    assert stages["tts"].builder == "openai.tts", "the Wyoming stage is replaced, not given an http URL"


def test_the_openai_tts_builder_reads_its_args_and_key(monkeypatch):
    monkeypatch.setenv("DUPLEX_TTS_API_KEY", "sk-test")
    tts = build_openai_tts(BuildContext(stage="tts", args={"url": "http://127.0.0.1:9/v1/", "voice": "joe",
                                                           "response_format": "wav"}))
    assert tts.base_url == "http://127.0.0.1:9/v1" and tts._api_key == "sk-test"
    assert (tts.speech.voice, tts.speech.response_format, tts.speech.pcm_rate) == ("joe", "wav", 24000)
    with pytest.raises(ValueError, match="stage tts: response_format"):
        build_openai_tts(BuildContext(stage="tts", args={"url": "http://127.0.0.1:9/v1", "response_format": "mp3"}))
    with pytest.raises(ValueError, match="expected the server's base URL"):
        build_openai_tts(BuildContext(stage="tts", args={"url": "tcp://127.0.0.1:9"}))


def test_voice_lists_are_read_in_the_shapes_servers_give_them():
    assert voice_names({"voices": ["af_bella", "am_adam"]}) == ("af_bella", "am_adam")  # Kokoro-FastAPI
    assert voice_names({"object": "list", "data": [{"id": "en_US-ryan-high", "name": "Ryan"}]}) == \
        ("en_US-ryan-high",)  # loudness-tts
    assert voice_names([{"name": "joe"}]) == ("joe",)
    assert voice_names({"object": "list", "data": [{"created": 1}]}) is None
    assert voice_names({"detail": "Not Found"}) is None
    assert voice_names({"data": [{"id": "a"}], "total": 1683}) is None, "one page of a longer list proves nothing"


def test_a_pipeline_without_that_stage_is_named():
    with pytest.raises(ConfigError, match="no tts stage"):
        load_with_servers("toy", [], None, TTS)


def test_serve_refuses_a_url_of_no_protocol_before_starting_anything():
    done = subprocess.run([sys.executable, "-m", "duplex.cli", "serve", "--tts", "ftp://127.0.0.1:9/v1",
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--tts" in done.stderr and "http(s)://" in done.stderr, done.stderr


def test_builders_name_the_missing_server_and_bad_args(monkeypatch):
    monkeypatch.delenv("DUPLEX_ASR_URL", raising=False)
    with pytest.raises(ValueError, match=r"--asr tcp://HOST:PORT.*\$DUPLEX_ASR_URL"):
        build_asr(BuildContext(stage="asr"))
    with pytest.raises(ValueError, match="stage tts: clause_words"):
        build_tts(BuildContext(stage="tts", args={"url": TTS, "clause_words": 0}))
    monkeypatch.setenv("DUPLEX_TTS_URL", TTS)
    assert build_tts(BuildContext(stage="tts")).endpoint.port == 10200


def test_the_session_voice_setting_is_kept_for_the_tts_stage():
    config = apply_settings(SessionConfig(), SessionSettings(audio=AudioSettings(output=AudioOutput(voice="amy"))))
    assert config.voice == "amy"
    assert apply_settings(config, SessionSettings(voice="joe")).voice == "joe"  # the beta place
    assert apply_settings(config, SessionSettings(instructions="Hi.")).voice == "amy"  # kept when not named

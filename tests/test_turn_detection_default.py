"""Which turn detection a session starts with and how it says so: the voice pipelines that
transcribe (``local``, ``engine``) end turns by meaning (``semantic_vad``) unless a client asks
otherwise; the weight-free test pipelines keep the silence rule. A client that asks for
``server_vad`` or ``turn_detection: null`` gets exactly that, and ``session.created`` says whether
semantic turns are judged by the end-of-turn audio model or by their words only."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from duplex.config.loader import load_pipeline
from duplex.models.smart_turn import SmartTurnUnavailable, smart_turn_path
from duplex.server.serve import session_defaults
from duplex.server.turn_end import LazyTurnEnd, load_turn_end_model
from duplex.session.protocol import describe_session, handle_client_message
from duplex.session.realtime import events as ev
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.ws_client import RATE, WsCaller
from tests.session_fakes import Call

SEMANTIC_BY_DEFAULT = ("local", "engine")
SILENCE_BY_DEFAULT = ("toy", "toy-voice", "omni-tiny")  # no ASR: a semantic judge would have no words


def _defaults(config: str):
    return session_defaults(load_pipeline(config).session, "")


@pytest.mark.parametrize("config", SEMANTIC_BY_DEFAULT + SILENCE_BY_DEFAULT)
def test_the_voice_pipelines_end_turns_by_meaning_by_default(config):
    expected = "semantic_vad" if config in SEMANTIC_BY_DEFAULT else "server_vad"
    assert _defaults(config).turn_detection == expected


def _update(call: Call, turn_detection: str) -> dict:
    handle_client_message(call.session, '{"type": "session.update", "session": {"type": "realtime", "audio": '
                                        f'{{"input": {{"turn_detection": {turn_detection}}}}}}}}}', "local")
    assert not call.of_type(ev.ErrorEvent), call.of_type(ev.ErrorEvent)
    return call.of_type(ev.SessionUpdated)[-1].session["audio"]["input"]["turn_detection"]


def test_a_client_gets_the_turn_detection_it_asks_for():
    call = Call(_defaults("local"))
    assert describe_session(call.session, "local")["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert call.session.detector.silence_ms == call.session.config.semantic.longest_pause_ms
    described = _update(call, '{"type": "server_vad"}')
    assert described == {"type": "server_vad", "threshold": 0.67, "prefix_padding_ms": 300, "silence_duration_ms": 500}
    assert call.session.config.turn_detection == "server_vad" and call.session.config.judge_ms is None
    assert call.session.detector.silence_ms == 500  # turns end on the plain VAD's silence again
    assert call.session.config.pause_ms == 200  # local's preemptive generation applies to silence turns
    assert _update(call, "null") is None
    assert call.session.config.turn_detection == "none"
    assert _update(call, '{"type": "semantic_vad"}')["type"] == "semantic_vad"
    assert call.session.config.semantic_turns


def test_the_session_says_whether_semantic_turns_hear_the_voice():
    class Model:  # the session only asks it to get ready here; no turn is judged
        def prepare(self) -> None: ...
        async def complete_probability(self, audio: np.ndarray) -> float: return 1.0

    with_model = describe_session(Call(_defaults("local"), turn_end=Model()).session, "local")
    words_only = describe_session(Call(_defaults("local"), turn_end=None).session, "local")
    assert with_model["duplex_turn_end"] == {"audio_model": True}
    assert words_only["duplex_turn_end"] == {"audio_model": False}


def _missing() -> None:
    raise SmartTurnUnavailable("semantic end of turn needs the pipecat-ai wheel for its Smart Turn model")


@pytest.mark.parametrize("eager", [True, False])
def test_a_server_without_the_audio_model_says_so_at_start(caplog, eager):
    with caplog.at_level(logging.WARNING, logger="duplex.server"):
        assert load_turn_end_model(eager=eager, locate=_missing) is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    said = record.getMessage()
    assert "no end-of-turn audio model (Smart Turn)" in said and "words only" in said and "pipecat-ai" in said
    assert ("this pipeline's sessions end turns by meaning" in said) is eager


def test_a_server_with_the_audio_model_lends_it_quietly(caplog):
    try:
        smart_turn_path()
    except SmartTurnUnavailable as exc:
        pytest.skip(str(exc))
    with caplog.at_level(logging.WARNING, logger="duplex.server"):
        model = load_turn_end_model(eager=False)
    assert isinstance(model, LazyTurnEnd) and not caplog.records


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_an_sdk_client_on_a_semantic_server_can_ask_for_silence_turns():
    """A server whose sessions default to semantic_vad (toy-voice with that default, so no model
    weights are needed) as the ``openai`` SDK sees it: it says so, and a client that asks for
    server_vad gets silence-ended turns (no pause is judged), or none at all."""
    order = np.concatenate([espeak("I would like a large milk tea with pearls please", rate=RATE),
                            np.zeros(RATE, np.float32)])
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--session.turn_detection", "semantic_vad"]) as server:
        async with WsCaller(server.url) as caller:
            created = caller.of_type("session.created")[0].session
            assert created.audio.input.turn_detection.type == "semantic_vad"
            assert created.to_dict()["duplex_turn_end"] == {"audio_model": True}
            await caller.conn.session.update(session={"type": "realtime", "audio": {
                "input": {"turn_detection": {"type": "server_vad"}}}})
            updated = await caller.wait("session.updated")
            assert updated.session.audio.input.turn_detection.type == "server_vad"
            assert updated.session.audio.input.turn_detection.silence_duration_ms == 500
            caller.say(order)
            stopped = await caller.wait("input_audio_buffer.speech_stopped", timeout=30)
            await caller.wait("response.created", timeout=30)
            assert not caller.of_type("duplex.turn.judged"), "a silence turn was judged"
            assert stopped.audio_end_ms > 0
            asked = time.monotonic()
            await caller.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            updated = await caller.wait("session.updated", after=asked)
            assert updated.session.audio.input.turn_detection is None
        assert server.stop() == 0

"""Realtime event decoding and session settings from clients."""

from __future__ import annotations

import json

import pytest

from duplex.config.session import BargeInConfig, PreemptConfig, SemanticTurnConfig, SessionConfig, VadConfig
from duplex.session.protocol import apply_settings
from duplex.session.realtime import events as ev


@pytest.mark.parametrize("raw, code", [
    ("{", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    ('{"type": 3}', "missing_type"),
    ('{"type": "transcription_session.update", "session": {}}', "unknown_event"),
    ('{"type": "conversation.item.truncate", "item_id": "x"}', "invalid_event"),
    ('{"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": "long"}}}',
     "invalid_session_settings"),
])
def test_bad_client_events_have_codes(raw, code):
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event(raw)
    assert info.value.code == code


def test_error_keeps_the_clients_event_id():
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event('{"type": "nope", "event_id": "evt_42"}')
    assert info.value.event_id == "evt_42" and "nope" in str(info.value)


@pytest.mark.parametrize("event, path", [
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 1500, "extra": True}, "extra"),
    ({"type": "session.update", "session": {"silence_ms": 300}}, "silence_ms"),
    ({"type": "session.update", "session": {"turn_detection": {"silence_ms": 300}}}, "silence_ms"),
    ({"type": "session.update", "session": {"audio": {"input": {"vad": {}}}}}, "vad"),
    ({"type": "response.create", "response": {"temperature": 0.1}}, "temperature"),
])
def test_unknown_keys_are_errors_that_name_them(event, path):
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event(json.dumps(event))
    assert info.value.code == "unknown_parameter" and f"`{path}`" in str(info.value)


@pytest.mark.parametrize("session, path, bound", [
    ({"turn_detection": {"prefix_padding_ms": 10**9}}, "turn_detection.prefix_padding_ms", "<= 2000"),
    ({"turn_detection": {"silence_duration_ms": 2**63}}, "turn_detection.silence_duration_ms", "<= 10000"),
    ({"turn_detection": {"silence_duration_ms": 10}}, "turn_detection.silence_duration_ms", ">= 60"),
    ({"turn_detection": {"threshold": 1.5}}, "turn_detection.threshold", "<= 1.0"),
    ({"audio": {"input": {"turn_detection": {"prefix_padding_ms": -1}}}}, "prefix_padding_ms", ">= 0"),
    ({"preemptive_generation": {"pause_ms": 10**6}}, "preemptive_generation.pause_ms", "<= 10000"),
    ({"instructions": "x" * 40000}, "instructions", "length <= 32768"),
    ({"tools": [{"name": f"t{n}"} for n in range(129)]}, "tools", "length <= 128"),
])
def test_settings_out_of_bounds_are_refused_naming_field_and_range(session, path, bound):
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event(json.dumps({"type": "session.update", "session": session}))
    assert path in str(info.value) and bound in str(info.value)


def test_settings_at_their_bounds_are_taken():
    update = ev.decode_client_event(json.dumps({"type": "session.update", "session": {
        "turn_detection": {"prefix_padding_ms": 2000, "silence_duration_ms": 10000},
        "input_audio_transcription": {"model": "whisper-1"}}}))
    config = apply_settings(SessionConfig(), update.session)
    assert (config.vad.prefix_padding_ms, config.vad.silence_ms) == (2000, 10000)


# each client setting that a config field holds, the session update's path to it, and the field
_CLIENT_FIELDS = [
    (("turn_detection", "prefix_padding_ms"), VadConfig, "prefix_padding_ms"),
    (("turn_detection", "silence_duration_ms"), VadConfig, "silence_ms"),
    (("turn_detection", "speculate_ms"), SemanticTurnConfig, "speculate_ms"),
    (("preemptive_generation", "pause_ms"), PreemptConfig, "pause_ms"),
    (("barge_in", "interrupt_ms"), BargeInConfig, "interrupt_ms"),
    (("barge_in", "resume_ms"), BargeInConfig, "resume_ms"),
    (("barge_in", "max_overlap_ms"), BargeInConfig, "max_overlap_ms"),
    (("barge_in", "words_wait_ms"), BargeInConfig, "words_wait_ms"),
]


@pytest.mark.parametrize(("path", "model", "name"), _CLIENT_FIELDS)
def test_a_client_setting_takes_its_range_from_the_config_field(path, model, name):
    """The range is declared once (config.py): a client value at each end of the config field's
    range decodes, one past either end is refused when the event is decoded."""
    low = next(m.ge for m in model.model_fields[name].metadata if hasattr(m, "ge"))
    high = next(m.le for m in model.model_fields[name].metadata if hasattr(m, "le"))

    def update(value: int) -> str:
        return json.dumps({"type": "session.update", "session": {path[0]: {path[1]: value}}})

    for value in (low, high):
        ev.decode_client_event(update(value))
    for value, bound in ((low - 1, f">= {low}"), (high + 1, f"<= {high}")):
        with pytest.raises(ev.ClientEventError) as info:
            ev.decode_client_event(update(value))
        assert ".".join(path) in str(info.value) and bound in str(info.value)


def test_settings_in_ga_and_beta_shapes_map_onto_the_vad():
    ga = ev.decode_client_event(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "instructions": "hi",
        "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 1.0, "silence_duration_ms": 300}}}}}))
    config = apply_settings(SessionConfig(), ga.session)
    assert (config.instructions, config.vad.aggressiveness, config.vad.silence_ms) == ("hi", 3, 300)
    beta = ev.decode_client_event(json.dumps({"type": "session.update",
                                              "session": {"turn_detection": {"prefix_padding_ms": 100}}}))
    assert apply_settings(config, beta.session).vad.prefix_padding_ms == 100


@pytest.mark.parametrize("detection, message", [
    ({"type": "vad_of_the_future"}, "server_vad, semantic_vad or none"),
    ({"silence_duration_ms": 100}, "pause_ms"),  # shorter than the preemptive pause: refused by the config
])
def test_out_of_range_settings_are_refused(detection, message):
    update = ev.decode_client_event(json.dumps({"type": "session.update", "session": {"turn_detection": detection}}))
    preempting = SessionConfig.model_validate({"preemptive_generation": {"enabled": True, "pause_ms": 200}})
    with pytest.raises(ValueError, match=message):
        apply_settings(preempting, update.session)


def test_server_events_carry_their_realtime_type():
    encoded = json.loads(ev.encode_event(ev.ItemTruncated(item_id="item_1", audio_end_ms=640)))
    assert encoded == {"type": "conversation.item.truncated", "event_id": "", "item_id": "item_1",
                       "content_index": 0, "audio_end_ms": 640, "transcript": None}

"""Realtime event decoding and session settings from clients."""

from __future__ import annotations

import json

import pytest

from duplex.session import events as ev
from duplex.session.config import SessionConfig
from duplex.session.protocol import apply_settings


@pytest.mark.parametrize("raw, code", [
    ("{", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    ('{"type": 3}', "missing_type"),
    ('{"type": "transcription_session.update", "session": {}}', "unknown_event"),
    ('{"type": "conversation.item.truncate", "item_id": "x"}', "invalid_event"),
    ('{"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": "long"}}}', "invalid_event"),
])
def test_bad_client_events_have_codes(raw, code):
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event(raw)
    assert info.value.code == code


def test_error_keeps_the_clients_event_id():
    with pytest.raises(ev.ClientEventError) as info:
        ev.decode_client_event('{"type": "nope", "event_id": "evt_42"}')
    assert info.value.event_id == "evt_42" and "nope" in str(info.value)


def test_known_events_decode_with_unknown_fields_ignored():
    event = ev.decode_client_event(json.dumps({"type": "conversation.item.truncate", "item_id": "item_1",
                                               "content_index": 0, "audio_end_ms": 1500, "extra": True}))
    assert isinstance(event, ev.ItemTruncate) and event.audio_end_ms == 1500


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
    ({"type": "semantic_vad"}, "server_vad or none"),
    ({"threshold": 1.5}, "within 0..1"),
    ({"silence_duration_ms": 10}, "silence_ms"),
])
def test_out_of_range_settings_are_refused(detection, message):
    update = ev.decode_client_event(json.dumps({"type": "session.update", "session": {"turn_detection": detection}}))
    with pytest.raises(ValueError, match=message):
        apply_settings(SessionConfig(), update.session)


def test_server_events_carry_their_realtime_type():
    encoded = json.loads(ev.encode_event(ev.ItemTruncated(item_id="item_1", audio_end_ms=640)))
    assert encoded == {"type": "conversation.item.truncated", "event_id": "", "item_id": "item_1",
                       "content_index": 0, "audio_end_ms": 640}

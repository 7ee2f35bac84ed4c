"""Realtime events on the wire (msgspec structs, JSON), named as in the OpenAI Realtime API.

Server events are what a session tells its client; client events are what it accepts. Events
of ours that have no Realtime counterpart are prefixed ``duplex.``.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class ServerEvent(msgspec.Struct, kw_only=True, tag_field="type"):
    event_id: str = ""  # set by the session when it sends the event


def _server(name: str) -> dict[str, Any]:
    return {"tag": name, "kw_only": True, "tag_field": "type"}


class SessionCreated(ServerEvent, **_server("session.created")):
    session: dict


class SessionUpdated(ServerEvent, **_server("session.updated")):
    session: dict


class SpeechStarted(ServerEvent, **_server("input_audio_buffer.speech_started")):
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, **_server("input_audio_buffer.speech_stopped")):
    audio_end_ms: int
    item_id: str


class InputCommitted(ServerEvent, **_server("input_audio_buffer.committed")):
    item_id: str
    previous_item_id: str | None = None


class InputCleared(ServerEvent, **_server("input_audio_buffer.cleared")):
    pass


class ItemAdded(ServerEvent, **_server("conversation.item.added")):
    item: dict
    previous_item_id: str | None = None


class TranscriptionDelta(ServerEvent, **_server("conversation.item.input_audio_transcription.delta")):
    item_id: str
    content_index: int = 0
    delta: str


class TranscriptionCompleted(ServerEvent, **_server("conversation.item.input_audio_transcription.completed")):
    item_id: str
    content_index: int = 0
    transcript: str


class ResponseCreated(ServerEvent, **_server("response.created")):
    response: dict


class OutputItemAdded(ServerEvent, **_server("response.output_item.added")):
    response_id: str
    output_index: int = 0
    item: dict


class AudioTranscriptDelta(ServerEvent, **_server("response.output_audio_transcript.delta")):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class AudioTranscriptDone(ServerEvent, **_server("response.output_audio_transcript.done")):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    transcript: str


class ResponseDone(ServerEvent, **_server("response.done")):
    response: dict


class OutputAudioStarted(ServerEvent, **_server("output_audio_buffer.started")):
    response_id: str


class OutputAudioStopped(ServerEvent, **_server("output_audio_buffer.stopped")):
    response_id: str


class OutputAudioCleared(ServerEvent, **_server("output_audio_buffer.cleared")):
    response_id: str


class ItemTruncated(ServerEvent, **_server("conversation.item.truncated")):
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ErrorEvent(ServerEvent, **_server("error")):
    error: dict


class StateChanged(ServerEvent, **_server("duplex.state")):
    state: str


class TurnMetrics(ServerEvent, **_server("duplex.metrics")):
    """Per-turn timings measured at the server: time to first audio (end of user speech ->
    first agent frame handed to the transport) and barge-in stop (speech onset -> output
    flushed)."""

    response_id: str
    ttfa_ms: float | None = None
    barge_in_ms: float | None = None


class PreemptiveStarted(ServerEvent, **_server("duplex.preemptive.started")):
    """The caller paused: a response to the turn so far is being made, its audio held back."""

    item_id: str  # the user item it answers
    request_id: str
    audio_end_ms: int  # the caller's audio it answers ends here (stream time)


class PreemptiveCancelled(ServerEvent, **_server("duplex.preemptive.cancelled")):
    """The caller went on speaking: the speculative response was aborted, unheard."""

    item_id: str
    request_id: str
    audio_start_ms: int  # where the caller's speech resumed
    reason: str


class PreemptiveCommitted(ServerEvent, **_server("duplex.preemptive.committed")):
    """The turn ended as the speculation assumed: the response (``response_id``) plays now."""

    item_id: str
    request_id: str
    response_id: str
    audio_ready_ms: int  # agent audio already made when the turn ended


_encoder = msgspec.json.Encoder()


def encode_event(event: ServerEvent) -> str:
    return _encoder.encode(event).decode()


# ---- client events -------------------------------------------------------------------------


class TurnDetection(msgspec.Struct, kw_only=True):
    type: str = "server_vad"
    threshold: float | None = None  # 0..1, mapped onto webrtcvad aggressiveness 0..3
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None


class AudioInput(msgspec.Struct, kw_only=True):
    turn_detection: TurnDetection | None = None


class AudioSettings(msgspec.Struct, kw_only=True):
    input: AudioInput | None = None


class PreemptiveSettings(msgspec.Struct, kw_only=True):
    """Ours (no Realtime counterpart): see SessionConfig.preemptive_generation."""

    enabled: bool | None = None
    pause_ms: int | None = None


class SessionSettings(msgspec.Struct, kw_only=True):
    instructions: str | None = None
    preemptive_generation: PreemptiveSettings | None = None
    turn_detection: TurnDetection | None = None  # beta shape
    audio: AudioSettings | None = None  # GA shape: audio.input.turn_detection


def _client(name: str) -> dict[str, Any]:
    return {"tag": name, "kw_only": True, "tag_field": "type"}


class ClientEvent(msgspec.Struct, kw_only=True, tag_field="type"):
    event_id: str | None = None


class SessionUpdate(ClientEvent, **_client("session.update")):
    session: SessionSettings


class ResponseOptions(msgspec.Struct, kw_only=True):
    instructions: str | None = None


class ResponseCreate(ClientEvent, **_client("response.create")):
    response: ResponseOptions | None = None


class ResponseCancel(ClientEvent, **_client("response.cancel")):
    response_id: str | None = None


class ItemTruncate(ClientEvent, **_client("conversation.item.truncate")):
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class InputClear(ClientEvent, **_client("input_audio_buffer.clear")):
    pass


class OutputClear(ClientEvent, **_client("output_audio_buffer.clear")):
    pass


CLIENT_EVENTS = (SessionUpdate, ResponseCreate, ResponseCancel, ItemTruncate, InputClear, OutputClear)
AnyClientEvent = Union[SessionUpdate, ResponseCreate, ResponseCancel, ItemTruncate, InputClear, OutputClear]
_client_decoder = msgspec.json.Decoder(AnyClientEvent)
_type_probe = msgspec.json.Decoder(dict)
KNOWN_CLIENT_EVENTS = frozenset(cls.__struct_config__.tag for cls in CLIENT_EVENTS)


class ClientEventError(ValueError):
    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.event_id = event_id


def decode_client_event(raw: str | bytes) -> AnyClientEvent:
    """Parse one data-channel message; raises ClientEventError with a Realtime-style code."""
    try:
        probe = _type_probe.decode(raw)
    except msgspec.DecodeError as exc:
        raise ClientEventError("invalid_json", f"not a JSON object: {exc}") from None
    event_id = probe.get("event_id") if isinstance(probe.get("event_id"), str) else None
    kind = probe.get("type")
    if not isinstance(kind, str):
        raise ClientEventError("missing_type", "event has no string 'type'", event_id)
    if kind not in KNOWN_CLIENT_EVENTS:
        known = ", ".join(sorted(KNOWN_CLIENT_EVENTS))
        raise ClientEventError("unknown_event", f"unknown event type {kind!r}; supported: {known}", event_id)
    try:
        return _client_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ClientEventError("invalid_event", f"{kind}: {exc}", event_id) from None

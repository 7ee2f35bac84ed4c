"""Realtime events on the wire (msgspec structs, JSON), named as in the OpenAI Realtime API.

Server events are what a session tells its client; client events are what it accepts. Events
of ours that have no Realtime counterpart are prefixed ``duplex.``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# -- resources inside server events ----------------------------------------------------------
ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]


class ContentPart(msgspec.Struct, kw_only=True):
    type: Literal["input_audio", "output_audio"]
    transcript: str | None = None


class MessageItem(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: Literal["user", "assistant"]
    status: ItemStatus
    content: list[ContentPart]


class StatusDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["cancelled", "failed"]
    reason: str | None = None  # why it was cancelled (turn_detected, client_cancelled, ...)
    error: str | None = None  # what failed it


class ResponseResource(msgspec.Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: ResponseStatus
    status_details: StatusDetails | None = None
    output: list[MessageItem]
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str  # invalid_request_error | server_error
    code: str
    message: str
    event_id: str | None = None  # the client event it answers


def user_audio_item(item_id: str) -> MessageItem:
    """The caller's turn, as the conversation item it becomes when committed."""
    return MessageItem(id=item_id, role="user", status="completed",
                       content=[ContentPart(type="input_audio", transcript=None)])


def assistant_item(item_id: str, transcript: str, status: ItemStatus) -> MessageItem:
    return MessageItem(id=item_id, role="assistant", status=status,
                       content=[ContentPart(type="output_audio", transcript=transcript)])


def response_resource(response_id: str, item_id: str, transcript: str, status: ResponseStatus,
                      details: StatusDetails | None = None) -> ResponseResource:
    """A response as ``response.created`` / ``response.done`` describe it: no output while in
    progress, then its one assistant item (complete only if the response completed)."""
    output = [] if status == "in_progress" else [
        assistant_item(item_id, transcript, "completed" if status == "completed" else "incomplete")]
    return ResponseResource(id=response_id, status=status, status_details=details, output=output)


# -- server events -----------------------------------------------------------------------------
class ServerEvent(msgspec.Struct, kw_only=True, tag_field="type"):
    event_id: str = ""  # set by the session when it sends the event


class SessionCreated(ServerEvent, kw_only=True, tag="session.created"):
    session: dict


class SessionUpdated(ServerEvent, kw_only=True, tag="session.updated"):
    session: dict


class SpeechStarted(ServerEvent, kw_only=True, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, kw_only=True, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class InputCommitted(ServerEvent, kw_only=True, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class InputCleared(ServerEvent, kw_only=True, tag="input_audio_buffer.cleared"):
    pass


class ItemAdded(ServerEvent, kw_only=True, tag="conversation.item.added"):
    item: MessageItem
    previous_item_id: str | None = None


class TranscriptionDelta(ServerEvent, kw_only=True, tag="conversation.item.input_audio_transcription.delta"):
    item_id: str
    content_index: int = 0
    delta: str


class TranscriptionCompleted(ServerEvent, kw_only=True, tag="conversation.item.input_audio_transcription.completed"):
    item_id: str
    content_index: int = 0
    transcript: str


class ResponseCreated(ServerEvent, kw_only=True, tag="response.created"):
    response: ResponseResource


class OutputItemAdded(ServerEvent, kw_only=True, tag="response.output_item.added"):
    response_id: str
    output_index: int = 0
    item: MessageItem


class AudioTranscriptDelta(ServerEvent, kw_only=True, tag="response.output_audio_transcript.delta"):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class AudioTranscriptDone(ServerEvent, kw_only=True, tag="response.output_audio_transcript.done"):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    transcript: str


class ResponseDone(ServerEvent, kw_only=True, tag="response.done"):
    response: ResponseResource


class OutputAudioStarted(ServerEvent, kw_only=True, tag="output_audio_buffer.started"):
    response_id: str


class OutputAudioStopped(ServerEvent, kw_only=True, tag="output_audio_buffer.stopped"):
    response_id: str


class OutputAudioCleared(ServerEvent, kw_only=True, tag="output_audio_buffer.cleared"):
    response_id: str


class ItemTruncated(ServerEvent, kw_only=True, tag="conversation.item.truncated"):
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ErrorEvent(ServerEvent, kw_only=True, tag="error"):
    error: ErrorDetail


class StateChanged(ServerEvent, kw_only=True, tag="duplex.state"):
    state: str


class TurnMetrics(ServerEvent, kw_only=True, tag="duplex.metrics"):
    """Per-turn timings measured at the server: time to first audio (end of user speech ->
    first agent frame handed to the transport) and barge-in stop (speech onset -> output
    flushed)."""

    response_id: str
    ttfa_ms: float | None = None
    barge_in_ms: float | None = None


class PreemptiveStarted(ServerEvent, kw_only=True, tag="duplex.preemptive.started"):
    """The caller paused: a response to the turn so far is being made, its audio held back."""

    item_id: str  # the user item it answers
    request_id: str
    audio_end_ms: int  # the caller's audio it answers ends here (stream time)


class PreemptiveCancelled(ServerEvent, kw_only=True, tag="duplex.preemptive.cancelled"):
    """The caller went on speaking: the speculative response was aborted, unheard."""

    item_id: str
    request_id: str
    audio_start_ms: int  # where the caller's speech resumed
    reason: str


class PreemptiveCommitted(ServerEvent, kw_only=True, tag="duplex.preemptive.committed"):
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


class ClientEvent(msgspec.Struct, kw_only=True, tag_field="type"):
    event_id: str | None = None


class SessionUpdate(ClientEvent, kw_only=True, tag="session.update"):
    session: SessionSettings


class ResponseOptions(msgspec.Struct, kw_only=True):
    instructions: str | None = None


class ResponseCreate(ClientEvent, kw_only=True, tag="response.create"):
    response: ResponseOptions | None = None


class ResponseCancel(ClientEvent, kw_only=True, tag="response.cancel"):
    response_id: str | None = None


class ItemTruncate(ClientEvent, kw_only=True, tag="conversation.item.truncate"):
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class InputClear(ClientEvent, kw_only=True, tag="input_audio_buffer.clear"):
    pass


class OutputClear(ClientEvent, kw_only=True, tag="output_audio_buffer.clear"):
    pass


CLIENT_EVENTS = (SessionUpdate, ResponseCreate, ResponseCancel, ItemTruncate, InputClear, OutputClear)
AnyClientEvent = SessionUpdate | ResponseCreate | ResponseCancel | ItemTruncate | InputClear | OutputClear
_client_decoder = msgspec.json.Decoder(AnyClientEvent)
_type_probe = msgspec.json.Decoder(dict)
KNOWN_CLIENT_EVENTS = frozenset(str(cls.__struct_config__.tag) for cls in CLIENT_EVENTS)


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

"""Realtime client events: what a session accepts, with the bounds of every setting.

Unknown fields are refused (``forbid_unknown_fields``), so a misspelt setting is an ``error``
event naming it instead of a silent no-op.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import BaseModel

from duplex.config.session import BargeInConfig, PreemptConfig, SemanticTurnConfig, SessionConfig, VadConfig

__all__ = [
    "TurnDetection",
    "AudioFormat",
    "Transcription",
    "Detection",
    "AudioInput",
    "AudioOutput",
    "AudioSettings",
    "PreemptiveSettings",
    "BargeInSettings",
    "ToolDefinition",
    "ToolChoiceFunction",
    "SessionSettings",
    "ClientEvent",
    "SessionUpdate",
    "ResponseOptions",
    "ResponseCreate",
    "ResponseCancel",
    "ItemTruncate",
    "InputClear",
    "OutputClear",
    "InputAppend",
    "InputCommit",
    "ItemContent",
    "ClientItem",
    "ItemCreate",
    "ItemDelete",
    "CallEnd",
    "CallDtmf",
    "CallTransfer",
    "CLIENT_EVENTS",
    "AnyClientEvent",
    "KNOWN_CLIENT_EVENTS",
    "ClientEventError",
    "decode_client_event",
]


# Bounds of the settings a client may send. A setting outside its range is refused when the event
# is decoded, naming its path and range: a huge prefix padding would re-send a whole call's audio
# with every turn, a huge silence would never end a turn. A setting that is also a session config
# field takes its bounds from that field (``bounds``), so each range is declared once, in config.py.
MAX_TOOLS = 128


def bounds(model: type[BaseModel], name: str) -> msgspec.Meta:
    """The bounds the config model declares for field ``name`` (pydantic's ``Field(ge=..., le=...,
    max_length=...)``), as msgspec's, for the client event that sets it."""
    meta = {key: getattr(constraint, key) for constraint in model.model_fields[name].metadata
            for key in ("ge", "gt", "le", "lt", "max_length") if hasattr(constraint, key)}
    if not meta:
        raise TypeError(f"{model.__name__}.{name} declares no bounds")
    return msgspec.Meta(**meta)


Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
PrefixPaddingMs = Annotated[int, bounds(VadConfig, "prefix_padding_ms")]
SilenceMs = Annotated[int, bounds(VadConfig, "silence_ms")]
PauseMs = Annotated[int, bounds(PreemptConfig, "pause_ms")]
SpeculateMs = Annotated[int, bounds(SemanticTurnConfig, "speculate_ms")]
Instructions = Annotated[str, bounds(SessionConfig, "instructions")]
SampleRate = Annotated[int, msgspec.Meta(ge=8000, le=48000)]
ShortText = Annotated[str, msgspec.Meta(max_length=256)]


class _Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A part of the session's settings: a key it does not know is an error, not a no-op."""


class TurnDetection(_Settings, kw_only=True):
    type: ShortText = "server_vad"  # server_vad, semantic_vad, or none (as ``turn_detection: null`` says too)
    threshold: Fraction | None = None  # mapped onto webrtcvad aggressiveness 0..3
    prefix_padding_ms: PrefixPaddingMs | None = None
    silence_duration_ms: SilenceMs | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None  # semantic_vad
    speculate_ms: SpeculateMs | None = None  # ours, semantic_vad: the pause that starts the answer (<= check)


class AudioFormat(_Settings, kw_only=True):
    type: ShortText  # audio/pcm, audio/pcmu, audio/pcma
    rate: SampleRate | None = None  # audio/pcm: 24000


class Transcription(_Settings, kw_only=True):
    """Accepted as Realtime clients send it: the pipeline's own ASR stage transcribes every turn
    (``conversation.item.input_audio_transcription.*``) whatever model is named here."""

    model: ShortText | None = None
    language: ShortText | None = None
    prompt: Annotated[str, msgspec.Meta(max_length=4096)] | None = None


# ``null`` switches turn detection off; absent leaves it as it is
Detection = TurnDetection | None | msgspec.UnsetType


class AudioInput(_Settings, kw_only=True):
    turn_detection: Detection = msgspec.UNSET
    format: AudioFormat | None = None
    transcription: Transcription | None = None


class AudioOutput(_Settings, kw_only=True):
    format: AudioFormat | None = None
    voice: ShortText | None = None


class AudioSettings(_Settings, kw_only=True):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class PreemptiveSettings(_Settings, kw_only=True):
    """Ours (no Realtime counterpart): see SessionConfig.preemptive_generation."""

    enabled: bool | None = None
    pause_ms: PauseMs | None = None


class BargeInSettings(_Settings, kw_only=True):
    """Ours: see SessionConfig.barge_in. ``mode``: listen (pause, then decide) or onset (any
    onset interrupts at once); ``words``: a listening decision hears the words too."""

    mode: ShortText | None = None
    interrupt_ms: Annotated[int, bounds(BargeInConfig, "interrupt_ms")] | None = None
    resume_ms: Annotated[int, bounds(BargeInConfig, "resume_ms")] | None = None
    max_overlap_ms: Annotated[int, bounds(BargeInConfig, "max_overlap_ms")] | None = None
    words: bool | None = None  # judge by the words too (where the pipeline transcribes an overlap)
    words_wait_ms: Annotated[int, bounds(BargeInConfig, "words_wait_ms")] | None = None


class ToolDefinition(_Settings, kw_only=True):
    """A function the model may call (``session.update`` ``tools``); checked in ``tools.py``."""

    type: ShortText = "function"
    name: ShortText
    description: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    parameters: dict = msgspec.field(default_factory=dict)  # a JSON Schema
    strict: bool = False


class ToolChoiceFunction(_Settings, kw_only=True):
    type: ShortText = "function"
    name: ShortText


class SessionSettings(_Settings, kw_only=True):
    instructions: Instructions | None = None
    tools: Annotated[list[ToolDefinition], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ShortText | ToolChoiceFunction | None = None  # auto | none | required | {type: function, name}
    preemptive_generation: PreemptiveSettings | None = None
    barge_in: BargeInSettings | None = None
    turn_detection: Detection = msgspec.UNSET  # beta shape
    audio: AudioSettings | None = None  # GA shape: audio.input.turn_detection
    type: ShortText | None = None  # "realtime" (GA clients send it)
    model: ShortText | None = None
    output_modalities: Annotated[list[ShortText], msgspec.Meta(max_length=2)] | None = None  # ["audio"] or ["text"]
    modalities: Annotated[list[ShortText], msgspec.Meta(max_length=2)] | None = None  # beta output_modalities
    voice: ShortText | None = None  # beta place of audio.output.voice
    input_audio_format: ShortText | None = None  # beta: pcm16, g711_ulaw, g711_alaw
    output_audio_format: ShortText | None = None
    input_audio_transcription: Transcription | None = None  # beta place of audio.input.transcription
    # ours, beside barge_in: record this call (where the server records on request); False asks
    # it to stop, refused where the server's policy requires the recording
    recording: bool | None = None


class ClientEvent(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=True):
    event_id: str | None = None


class SessionUpdate(ClientEvent, kw_only=True, tag="session.update"):
    session: SessionSettings


class ResponseOptions(_Settings, kw_only=True):
    instructions: Instructions | None = None
    output_modalities: list[str] | None = None
    modalities: list[str] | None = None  # beta name of output_modalities


class ResponseCreate(ClientEvent, kw_only=True, tag="response.create"):
    response: ResponseOptions | None = None


class ResponseCancel(ClientEvent, kw_only=True, tag="response.cancel"):
    response_id: str | None = None


class ItemTruncate(ClientEvent, kw_only=True, tag="conversation.item.truncate"):
    item_id: str
    content_index: int = 0
    audio_end_ms: Annotated[int, msgspec.Meta(ge=0)]


class InputClear(ClientEvent, kw_only=True, tag="input_audio_buffer.clear"):
    pass


class OutputClear(ClientEvent, kw_only=True, tag="output_audio_buffer.clear"):
    pass


class InputAppend(ClientEvent, kw_only=True, tag="input_audio_buffer.append"):
    audio: str  # base64, in the session's input format


class InputCommit(ClientEvent, kw_only=True, tag="input_audio_buffer.commit"):
    pass


class ItemContent(_Settings, kw_only=True):
    type: str  # input_text | input_audio (a user message's parts)
    text: str | None = None
    audio: str | None = None  # base64, in the session's input format
    transcript: str | None = None
    image_url: str | None = None  # input_image: known, and refused by name (``client_items.py``)


class ClientItem(_Settings, kw_only=True):
    id: str | None = None
    type: str = "message"
    object: str | None = None
    status: str | None = None
    role: str | None = None
    content: list[ItemContent] = []
    call_id: str | None = None  # function_call / function_call_output items
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class ItemCreate(ClientEvent, kw_only=True, tag="conversation.item.create"):
    item: ClientItem
    previous_item_id: str | None = None


class ItemDelete(ClientEvent, kw_only=True, tag="conversation.item.delete"):
    item_id: str


class CallEnd(ClientEvent, kw_only=True, tag="duplex.call.end"):
    """Ours: end the call (SIP BYE, the Twilio stream or WebRTC call closed), once the agent's
    current reply has played unless ``after_reply`` is false."""

    after_reply: bool = True
    reason: ShortText | None = None


class CallDtmf(ClientEvent, kw_only=True, tag="duplex.call.dtmf"):
    """Ours: send keypad digits to the far end (RFC 4733 on a SIP call)."""

    digits: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]


class CallTransfer(ClientEvent, kw_only=True, tag="duplex.call.transfer"):
    """Ours: transfer the call to ``target`` (a number or a SIP URI)."""

    target: ShortText


CLIENT_EVENTS = (SessionUpdate, ResponseCreate, ResponseCancel, ItemTruncate, InputClear, OutputClear,
                 InputAppend, InputCommit, ItemCreate, ItemDelete, CallEnd, CallDtmf, CallTransfer)
AnyClientEvent = (SessionUpdate | ResponseCreate | ResponseCancel | ItemTruncate | InputClear | OutputClear
                  | InputAppend | InputCommit | ItemCreate | ItemDelete | CallEnd | CallDtmf | CallTransfer)
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
        code = "invalid_session_settings" if kind == "session.update" else "invalid_event"
        if str(exc).startswith("Object contains unknown field"):
            code = "unknown_parameter"
        raise ClientEventError(code, f"{kind}: {exc}", event_id) from None

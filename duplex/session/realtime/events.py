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
    type: Literal["input_audio", "output_audio", "input_text", "output_text"]
    transcript: str | None = None
    text: str | None = None  # of the text parts


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


class TokenDetails(msgspec.Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """What a response used, in the units the pipeline streams: text tokens are the text
    deltas (a word of toy_voice, a token of the local thinker) and the words of the user turn;
    audio tokens are 20 ms frames of agent audio."""

    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: TokenDetails = msgspec.field(default_factory=TokenDetails)
    output_token_details: TokenDetails = msgspec.field(default_factory=TokenDetails)


class FunctionCallItem(msgspec.Struct, kw_only=True):
    """The model calling one of the client's functions (``tools.py`` makes these)."""

    id: str
    type: str = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str = ""


class ResponseResource(msgspec.Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: ResponseStatus
    status_details: StatusDetails | None = None
    output: list[MessageItem | FunctionCallItem]
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])
    usage: Usage | None = None  # set in response.done


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str  # invalid_request_error | server_error
    code: str
    message: str
    event_id: str | None = None  # the client event it answers


def user_audio_item(item_id: str) -> MessageItem:
    """The caller's turn, as the conversation item it becomes when committed."""
    return MessageItem(id=item_id, role="user", status="completed",
                       content=[ContentPart(type="input_audio", transcript=None)])


def user_text_item(item_id: str, text: str) -> MessageItem:
    """A typed user message (``conversation.item.create`` with ``input_text``)."""
    return MessageItem(id=item_id, role="user", status="completed", content=[ContentPart(type="input_text", text=text)])


def assistant_item(item_id: str, transcript: str, status: ItemStatus, text_only: bool = False) -> MessageItem:
    part = (ContentPart(type="output_text", text=transcript) if text_only
            else ContentPart(type="output_audio", transcript=transcript))
    return MessageItem(id=item_id, role="assistant", status=status, content=[part])


def response_resource(response_id: str, item_id: str, transcript: str, status: ResponseStatus,
                      details: StatusDetails | None = None, text_only: bool = False,
                      usage: Usage | None = None) -> ResponseResource:
    """A response as ``response.created`` / ``response.done`` describe it: no output while in
    progress, then its one assistant item (complete only if the response completed)."""
    output: list[MessageItem | FunctionCallItem] = [] if status == "in_progress" else [
        assistant_item(item_id, transcript, "completed" if status == "completed" else "incomplete", text_only)]
    return ResponseResource(id=response_id, status=status, status_details=details, output=output,
                            output_modalities=["text"] if text_only else ["audio"], usage=usage)


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
    transcript: str | None = None  # ours: the words the caller heard (null when the TTS does not say)


class ErrorEvent(ServerEvent, kw_only=True, tag="error"):
    error: ErrorDetail


class StateChanged(ServerEvent, kw_only=True, tag="duplex.state"):
    state: str


class TurnMetrics(ServerEvent, kw_only=True, tag="duplex.metrics"):
    """Per-turn timings measured at the server: time to first audio (end of user speech ->
    first agent frame handed to the transport) and barge-in stop (speech onset -> output
    flushed). With ``ttfa_ms`` come its parts, which add up to it (``turn_timing.PARTS``; a
    part the pipeline gives no mark for is null)."""

    response_id: str
    ttfa_ms: float | None = None
    barge_in_ms: float | None = None
    end_of_turn_ms: float | None = None  # end of speech -> turn committed (end-of-turn silence)
    asr_tail_ms: float | None = None  # -> final transcript
    first_token_ms: float | None = None  # -> first reply text
    first_phrase_ms: float | None = None  # -> all text of the first audio chunk
    tts_first_chunk_ms: float | None = None  # -> first audio chunk from the pipeline
    playout_ms: float | None = None  # -> its first frame handed to the transport


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


class ResponsePaused(ServerEvent, kw_only=True, tag="duplex.response.paused"):
    """The caller made a sound during the reply: its audio paused at once while the server
    listens (``barge_in.mode: listen``). An interruption follows as usual (speech_started,
    response.done cancelled), or ``duplex.response.resumed``."""

    response_id: str
    item_id: str
    audio_end_ms: int  # of the reply's audio, played up to here
    audio_start_ms: int  # the caller's onset (stream time of the input)


class ResponseResumed(ServerEvent, kw_only=True, tag="duplex.response.resumed"):
    """The sound was a backchannel or a noise: the reply plays on from where it paused."""

    response_id: str
    item_id: str
    kind: Literal["backchannel", "noise"]
    audio_end_ms: int  # of the reply's audio: it resumes here
    overlap_ms: int  # the caller's sound, from its onset to the decision
    voiced_ms: int
    transcript: str | None = None  # the words heard of it (a backchannel); null: judged by the sound


class OverlapJudged(ServerEvent, kw_only=True, tag="duplex.overlap.judged"):
    """What the caller's sound during the reply was (``barge_in.mode: listen``), and from what:
    ``words`` (the ASR's transcript of it, ``transcript``) or ``sound`` (voicing and duration).
    An interruption's events follow it; a backchannel's or a noise's ``duplex.response.resumed``."""

    response_id: str
    kind: Literal["interruption", "backchannel", "noise"]
    decided_by: Literal["words", "sound"]
    transcript: str | None = None
    audio_start_ms: int  # the caller's onset (stream time of the input)
    overlap_ms: int  # from the onset to the decision
    voiced_ms: int


_encoder = msgspec.json.Encoder()


def encode_event(event: ServerEvent) -> str:
    return _encoder.encode(event).decode()


class TurnJudged(ServerEvent, kw_only=True, tag="duplex.turn.judged"):
    """Semantic turns: a pause in the caller's turn was judged (``endpoint.py``). Complete: the
    turn ends now (``input_audio_buffer.speech_stopped`` follows); not: it waits for more."""

    item_id: str
    audio_end_ms: int  # the end of the speech before the pause
    probability: float | None  # the end-of-turn model's P(complete); None: no model on this server
    words_hang: bool  # the turn's last words say it goes on ("um", "and", "the", ...)
    words_ask: bool = False  # the turn's words end a question ("?"): complete, whatever the model says
    words_open: bool = False  # the transcript ends with no sentence's close: the model had to be surer
    complete: bool


# Client events live in client_events.py (its ``__all__``); the session and the doors reach them
# here too, as ``ev.SessionUpdate`` and so on.
from duplex.session.realtime.client_events import *  # noqa: E402, F403

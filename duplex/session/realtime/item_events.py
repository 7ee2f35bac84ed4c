"""Realtime server events of client items, text replies and WebSocket audio (the rest are in
``events.py``): what a typed message, a text-only reply and audio carried as events need."""

from __future__ import annotations

from duplex.session.realtime.events import MessageItem, ServerEvent


class TextDelta(ServerEvent, kw_only=True, tag="response.output_text.delta"):
    """A text-only response's reply text (an audio response's is ``output_audio_transcript``)."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class TextDone(ServerEvent, kw_only=True, tag="response.output_text.done"):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str


class OutputAudioDelta(ServerEvent, kw_only=True, tag="response.output_audio.delta"):
    """Agent audio as base64 in the session's output format (the WebSocket door; WebRTC and
    phones carry audio as media)."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class OutputAudioDone(ServerEvent, kw_only=True, tag="response.output_audio.done"):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ItemDone(ServerEvent, kw_only=True, tag="conversation.item.done"):
    item: MessageItem
    previous_item_id: str | None = None


class ItemDeleted(ServerEvent, kw_only=True, tag="conversation.item.deleted"):
    item_id: str

"""Conversation items a client adds itself, and the turns they make.

Besides speaking (the session's VAD makes the turns), a Realtime client may:

- type a message: ``conversation.item.create`` with a user ``input_text`` part;
- send a recorded clip: a user ``input_audio`` part (base64 in the session's input format);
- with ``turn_detection`` off, stream audio into the input buffer
  (``input_audio_buffer.append``) and end the turn by hand (``input_audio_buffer.commit``).

Each becomes a user item that waits here until ``response.create`` answers it: the waiting items
go into one request (``ClientTurn``): typed text as ``TurnRequest.text`` (the pipeline takes it
as the turn's transcript, so it joins the same history as a spoken turn), audio as the request's
caller audio. Text and audio are not mixed in one turn.

Audio arrives base64-encoded; how to decode it (PCM 24 kHz, G.711) is the transport's business,
so the door that knows the format sets ``decoder``; the default reads ``audio/pcm`` at 24 kHz.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from duplex.audio import SESSION_RATE, Resampler
from duplex.runtime.contract import CallerAudio
from duplex.session.realtime import events as ev
from duplex.session.realtime import item_events as iev
from duplex.session.vad import FrameClassifier

PCM_RATE = 24000  # ``audio/pcm``: 16-bit little-endian mono at 24 kHz
AudioDecoder = Callable[[bytes], np.ndarray]  # encoded bytes -> int16 mono at SESSION_RATE


class ItemError(ValueError):
    """A client item request that cannot be done; ``code`` names why (Realtime-style)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def pcm24_decoder() -> AudioDecoder:
    """``audio/pcm`` (int16 LE, 24 kHz) -> int16 16 kHz; keeps the resampler's state across calls."""
    resampler = Resampler(SESSION_RATE)

    def decode(data: bytes) -> np.ndarray:
        if len(data) % 2:
            raise ItemError("invalid_audio", f"audio/pcm is 16-bit samples: {len(data)} bytes is an odd count")
        return resampler(np.frombuffer(data, "<i2").astype(np.int16), PCM_RATE)

    return decode


@dataclass(frozen=True)
class ClientTurn:
    """What one ``response.create`` answers, and how."""

    user_item_id: str | None = None
    text: str | None = None  # typed words
    audio: CallerAudio | None = None  # a clip, or the committed input buffer
    instructions: str | None = None  # this response's own, over the session's
    output_audio: bool = True  # False: reply in text only


@dataclass
class _Pending:
    item_id: str
    text: str | None = None
    audio: np.ndarray | None = None  # int16 mono SESSION_RATE


class ClientItems:
    """The session's conversation items: their ids (all of them: the session's own too, so each
    new item knows the one before it), and the client's items waiting for a response."""

    def __init__(self, session_id: str, emit: Callable[[ev.ServerEvent], None], classifier: FrameClassifier) -> None:
        self._tag = session_id[-6:]
        self._count = 0
        self._emit = emit
        self._classifier = classifier  # the session's voice decision, for the frames of a clip
        self.decoder: AudioDecoder = pcm24_decoder()
        self._pending: list[_Pending] = []
        self._buffer: list[np.ndarray] = []  # appended by hand (turn_detection none), not committed yet
        self.last_item_id: str | None = None  # the newest item of the conversation, for previous_item_id
        self.output_audio = True  # the session's default (session.update output_modalities)

    # -- audio the client appends ---------------------------------------------------------------
    def decode(self, audio_b64: str) -> np.ndarray:
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ItemError("invalid_audio", "audio is not valid base64") from None
        return self.decoder(data)

    def buffer(self, samples: np.ndarray, max_s: float) -> None:
        """Caller audio with turn detection off: held until ``commit`` (the newest ``max_s``
        seconds of it: a microphone left streaming must not fill the memory)."""
        if samples.size:
            self._buffer.append(samples)
        excess = sum(len(b) for b in self._buffer) - int(max_s * SESSION_RATE)
        while excess > 0 and self._buffer:
            head = self._buffer[0]
            if len(head) <= excess:
                self._buffer.pop(0)
                excess -= len(head)
            else:
                self._buffer[0], excess = head[excess:], 0

    @property
    def buffered_ms(self) -> int:
        return 1000 * sum(len(b) for b in self._buffer) // SESSION_RATE

    def clear_buffer(self) -> None:
        self._buffer = []

    def commit(self) -> str:
        """The input buffer becomes a user audio item; returns its id."""
        if not self._buffer:
            raise ItemError("input_audio_buffer_commit_empty", "the input audio buffer is empty")
        samples = np.concatenate(self._buffer)
        self._buffer = []
        item = self._add(_Pending(self._new_client_id(), audio=samples))
        self._emit(ev.InputCommitted(item_id=item.item_id, previous_item_id=self.last_item_id))
        self._announce(item, ev.user_audio_item(item.item_id))
        return item.item_id

    # -- items the client creates ---------------------------------------------------------------
    def create(self, event: ev.ItemCreate) -> str:
        """A user message of text or audio parts; returns its id."""
        item = event.item
        if item.type != "message" or item.role != "user":
            raise ItemError("unsupported_item", f"conversation.item.create: items of type {item.type!r} with role "
                                                f"{item.role!r} are not supported here; send a user message")
        texts = [part.text or "" for part in item.content if part.type in ("input_text", "text")]
        clips = [part.audio for part in item.content if part.type == "input_audio" and part.audio]
        unknown = sorted({part.type for part in item.content} - {"input_text", "text", "input_audio"})
        if unknown:
            raise ItemError("unsupported_content", f"content parts of type {unknown} are not supported; use "
                                                   "input_text or input_audio")
        if not texts and not clips:
            raise ItemError("empty_item", "the message has no input_text or input_audio content")
        if texts and clips:
            raise ItemError("mixed_content", "a message is either text or audio here, not both")
        kind = "text" if texts else "audio"
        if self._pending and self._kind(self._pending[0]) != kind:
            raise ItemError("mixed_content", f"a {self._kind(self._pending[0])} item waits for a response; "
                                             f"send response.create before adding {kind}")
        if item.id is not None and (not item.id or len(item.id) > 64):
            raise ItemError("invalid_item_id", "item ids are 1..64 characters")
        item_id = item.id or self._new_client_id()
        if texts:
            pending = self._add(_Pending(item_id, text=" ".join(t.strip() for t in texts if t.strip())))
            self._announce(pending, ev.user_text_item(item_id, pending.text or ""))
        else:
            samples = np.concatenate([self.decode(clip) for clip in clips])
            pending = self._add(_Pending(item_id, audio=samples))
            self._announce(pending, ev.user_audio_item(item_id))
        return item_id

    def delete(self, item_id: str) -> None:
        """Only items no response has answered yet can go: answered ones are part of the
        pipeline's history, which keeps no per-item undo."""
        for index, item in enumerate(self._pending):
            if item.item_id == item_id:
                del self._pending[index]
                self._emit(iev.ItemDeleted(item_id=item_id))
                return
        raise ItemError("item_not_deletable", f"item {item_id!r} is not a waiting client item; items already "
                                              "answered stay in the conversation's history")

    # -- the next response ----------------------------------------------------------------------
    def take(self, options: ev.ResponseOptions | None) -> ClientTurn:
        """The waiting items as one turn (they are answered now), with the response's options."""
        pending, self._pending = self._pending, []
        instructions = options.instructions if options is not None else None
        output_audio = _wants_audio(options, self.output_audio)
        if not pending:
            return ClientTurn(instructions=instructions, output_audio=output_audio)
        if pending[0].text is not None:
            text = " ".join(item.text or "" for item in pending)
            return ClientTurn(pending[-1].item_id, text=text, instructions=instructions, output_audio=output_audio)
        samples = np.concatenate([item.audio for item in pending if item.audio is not None])
        return ClientTurn(pending[-1].item_id, audio=self._caller_audio(samples), instructions=instructions,
                          output_audio=output_audio)

    def _caller_audio(self, samples: np.ndarray) -> CallerAudio:
        step = self._classifier.frame_samples
        whole = samples[: len(samples) - len(samples) % step]
        voiced = [self._classifier.is_voiced(whole[i:i + step]) for i in range(0, len(whole), step)]
        return CallerAudio(whole.astype(np.float32) / 32768.0, voiced, self._classifier.config.frame_ms)

    # -- bookkeeping ----------------------------------------------------------------------------
    def new_id(self) -> str:
        """A new item's id (the session's spoken turns and replies take theirs here too)."""
        self._count += 1
        self.last_item_id = f"item_{self._tag}_{self._count}"
        return self.last_item_id

    def _new_client_id(self) -> str:
        previous = self.last_item_id
        item_id = self.new_id()
        self.last_item_id = previous  # it becomes the newest item when announced
        return item_id

    def _add(self, item: _Pending) -> _Pending:
        self._pending.append(item)
        return item

    def _announce(self, pending: _Pending, item: ev.MessageItem) -> None:
        previous = self.last_item_id if self.last_item_id != pending.item_id else None
        self.last_item_id = pending.item_id
        self._emit(ev.ItemAdded(item=item, previous_item_id=previous))
        self._emit(iev.ItemDone(item=item, previous_item_id=previous))

    @staticmethod
    def _kind(item: _Pending) -> str:
        return "text" if item.text is not None else "audio"


def wants_audio(modalities: list[str] | None, default: bool) -> bool:
    """Audio unless the modalities asked for leave it out."""
    return default if modalities is None else "audio" in modalities


def _wants_audio(options: ev.ResponseOptions | None, default: bool) -> bool:
    """``output_modalities`` (current) or ``modalities`` (beta) of a response.create."""
    if options is None:
        return default
    return wants_audio(options.output_modalities if options.output_modalities is not None else options.modalities,
                       default)

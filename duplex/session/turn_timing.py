"""Where one response's time to first audio went, split into the parts of a turn.

The session marks, on the monotonic clock, when each output *arrived* (before any holding back
for preemptive generation), and when the turn was committed and its first frame handed to the
transport. ``breakdown`` turns the marks into consecutive parts of the critical path from the end
of the caller's speech to that first frame:

    end_of_turn      speech end -> turn committed (the end-of-turn silence)
    asr_tail         -> the final transcript arrived
    first_token      -> the first reply text arrived
    first_phrase     -> the text the first audio chunk voices had all arrived
    tts_first_chunk  -> the first audio chunk arrived
    playout          -> its first frame was handed to the transport

Each part starts where the previous one ended (or the latest before it, if a mark came early) and
is never negative, so the parts add up to ``ttfa`` exactly. A mark that came before the turn was
committed (the answer was made during the caller's pause) costs nothing on the critical path: its
part is 0. A pipeline that sends no such output (no transcript, no text) has that part ``None``.
"""

from __future__ import annotations

import msgspec

from duplex.runtime.contract import AgentAudio, AgentText, Transcript

PARTS = ("end_of_turn", "asr_tail", "first_token", "first_phrase", "tts_first_chunk", "playout")


class TurnBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Milliseconds per part (``PARTS``); ``ttfa_ms`` is their sum."""

    ttfa_ms: float
    end_of_turn_ms: float | None = None
    asr_tail_ms: float | None = None
    first_token_ms: float | None = None
    first_phrase_ms: float | None = None
    tts_first_chunk_ms: float | None = None
    playout_ms: float | None = None

    def parts(self) -> dict[str, float | None]:
        return {part: getattr(self, f"{part}_ms") for part in PARTS}


class TurnTiming:
    """The marks of one response (seconds, monotonic)."""

    def __init__(self) -> None:
        self.committed: float | None = None
        self.transcript: float | None = None
        self.first_text: float | None = None
        self.first_chunk: float | None = None
        self._phrase_text = ""  # what the first audio chunk voices
        self._text = ""  # reply text until the first audio chunk ...
        self._text_marks: list[tuple[int, float]] = []  # ... and (its length, arrival) per delta

    def saw(self, event: object, now: float) -> None:
        """An output of the response arrived at ``now``."""
        if isinstance(event, Transcript):
            if event.final and self.transcript is None:
                self.transcript = now
        elif isinstance(event, AgentText):
            if event.text and self.first_chunk is None:
                self.first_text = self.first_text or now
                self._text += event.text
                self._text_marks.append((len(self._text), now))
        elif isinstance(event, AgentAudio) and self.first_chunk is None and len(event.samples):
            self.first_chunk = now
            self._phrase_text = event.text.strip()

    def _phrase_done(self) -> float | None:
        """When the text of the first audio chunk had all arrived (None: the chunk names no text
        that came as reply text)."""
        if not self._phrase_text:
            return None
        start = self._text.find(self._phrase_text)
        if start < 0:
            return None
        end = start + len(self._phrase_text)
        return next((at for length, at in self._text_marks if length >= end), None)

    def breakdown(self, speech_end: float, first_frame: float) -> TurnBreakdown:
        marks = (self.committed, self.transcript, self.first_text, self._phrase_done(), self.first_chunk, first_frame)
        parts: dict[str, float | None] = {}
        reached = speech_end
        for part, mark in zip(PARTS, marks):
            if mark is None:
                parts[f"{part}_ms"] = None
                continue
            end = max(mark, reached)
            parts[f"{part}_ms"] = round(1000 * (end - reached), 1)
            reached = end
        return TurnBreakdown(ttfa_ms=round(1000 * (reached - speech_end), 1), **parts)

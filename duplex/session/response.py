"""Book-keeping of one response: its ids, its runtime turn, what was heard, its timings."""

from __future__ import annotations

from typing import Callable

from duplex.session.runtime_port import Turn, TurnEnded, TurnOutput


class Response:
    def __init__(self, turn: Turn, item_id: str, user_item_id: str | None, clock: Callable[[], float]) -> None:
        self.turn = turn
        self.id = "resp_" + item_id.split("_", 1)[1]
        self.item_id = item_id  # the assistant message item its audio and transcript belong to
        self.user_item_id = user_item_id
        self._clock = clock
        self.transcript: list[str] = []
        self.audio_began = False  # its audio was queued for playout
        self.finished = False  # the runtime ended it (completed / failed)
        self.cancelled = False  # we stopped it; later outputs are dropped
        self.over = False  # nothing more will be played for it
        self.played_ms = 0
        self.audio_received_ms = 0.0  # agent audio the runtime delivered (played or not)
        # Speculative (preemptive) response: its outputs wait here until the turn really ends.
        self.speculative = False
        self.held: list[TurnOutput | TurnEnded] = []
        self.speech_end: float | None = None
        self.ttfa_ms: float | None = None

    def begin(self, speech_end: float) -> None:
        self.speech_end = speech_end

    def on_first_audio(self, due: float) -> None:
        if self.speech_end is not None:
            self.ttfa_ms = round(1000 * (due - self.speech_end), 1)

    def item(self, status: str) -> dict:
        content = [{"type": "output_audio", "transcript": "".join(self.transcript)}]
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def describe(self, status: str, details: dict | None = None) -> dict:
        output = [] if status == "in_progress" else [self.item("completed" if status == "completed" else "incomplete")]
        return {"id": self.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": output, "output_modalities": ["audio"]}

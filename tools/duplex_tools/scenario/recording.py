"""What a scenario run saw, on the client's monotonic clock: every microphone frame sent, every
agent frame heard, every event, and when each step played."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import av
import numpy as np

from duplex_tools.client import ScriptedMic


class RecordingMic(ScriptedMic):
    """The scripted microphone, also logging each frame it sends (time, RMS)."""

    def __init__(self, echo_gain: float = 0.0) -> None:
        super().__init__(echo_gain)
        self.sent: list[tuple[float, float]] = []

    async def recv(self) -> av.AudioFrame:
        frame = await super().recv()
        pcm = frame.to_ndarray().astype(np.float32) / 32768.0
        self.sent.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))
        return frame


@dataclass
class StepRecord:
    index: int
    kind: str
    title: str
    queued_at: float  # its audio went onto the microphone queue
    finished_at: float  # its last frame was sent
    onset: float | None = None  # its first loud frame was sent
    end: float | None = None  # its last loud frame was sent (end of speech), plus one frame
    trigger_error: str | None = None
    # Runtime request ids of the response playing when the step began (exclusive runs only)
    # and, if that response was aborted, how long after the abort reached the client every
    # stage had let go of them.
    playing_ids: list[str] | None = None
    freed_after_ms: float | None = None
    free_error: str | None = None


@dataclass
class Recording:
    scenario: str
    session_id: str = ""
    silence_ms: int = 500
    started_at: float = 0.0  # the call was connected
    sent: list[tuple[float, float]] = field(default_factory=list)
    heard: list[tuple[float, float, int | None]] = field(default_factory=list)  # (arrival, RMS, pts)
    events: list[tuple[float, dict]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    session_stats: dict | None = None  # the server's view of our session, once quiet
    idle_at_end: bool | None = None  # every stage held nothing once the call was quiet
    idle_detail: str = ""
    hangup_status: int | None = None
    error: str | None = None  # the run could not go on (connect refused, trigger timed out)
    finished_at: float = 0.0

    @property
    def t0(self) -> float:
        return self.sent[0][0] if self.sent else self.started_at

    def events_of(self, kind: str, since: float = float("-inf"),
                  until: float = float("inf")) -> list[tuple[float, dict]]:
        return [(at, e) for at, e in self.events if e.get("type") == kind and since <= at < until]

    def loud_heard(self, since: float, until: float = float("inf"), threshold: float = 0.01) -> list[float]:
        return [at for at, rms, _ in self.heard if since <= at < until and rms > threshold]

    def to_json(self) -> dict:
        t0 = self.t0

        def rel(value: float | None) -> float | None:
            return None if value is None else round(value - t0, 4)

        return {
            "scenario": self.scenario, "session_id": self.session_id, "silence_ms": self.silence_ms,
            "error": self.error, "hangup_status": self.hangup_status, "idle_at_end": self.idle_at_end,
            "idle_detail": self.idle_detail, "session_stats": self.session_stats,
            "steps": [{"index": s.index, "kind": s.kind, "title": s.title, "queued_at": rel(s.queued_at),
                       "onset": rel(s.onset), "end": rel(s.end), "finished_at": rel(s.finished_at),
                       "trigger_error": s.trigger_error, "playing_ids": s.playing_ids,
                       "freed_after_ms": s.freed_after_ms, "free_error": s.free_error} for s in self.steps],
            "events": [{"at": rel(at), **e} for at, e in self.events],
            "sent_rms": [[rel(at), round(rms, 4)] for at, rms in self.sent],
            "heard_rms": [[rel(at), round(rms, 4)] for at, rms, _ in self.heard],
        }

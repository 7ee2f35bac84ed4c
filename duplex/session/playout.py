"""Agent audio waiting to be heard, in the transport's format, handed out one frame at a time.

The transport pulls a frame every ``frame_ms`` whether or not the agent is speaking (silence
when empty), so the stream's clock never stops. The playout counts how much of each response's
audio was actually pulled: that is where a barge-in truncates the response.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from duplex.audio import Resampler


class AudioClear(enum.Enum):
    """Why a door must drop the agent audio its far end has queued (``door.Door.clear_audio``)."""

    CUT = "cut"  # the caller interrupted: the reply is over
    PAUSED = "paused"  # an overlap is being judged: silence now, the reply may resume


@dataclass(frozen=True)
class OutputFormat:
    sample_rate: int = 48000
    channels: int = 2
    frame_ms: int = 20

    @property
    def frame_samples(self) -> int:
        return self.sample_rate * self.frame_ms // 1000

    @property
    def layout(self) -> str:
        return "mono" if self.channels == 1 else "stereo"


@dataclass(frozen=True)
class PulledFrame:
    pcm: np.ndarray  # int16, frame_samples * channels, interleaved
    item_id: str | None  # the response item this audio belongs to; None for silence
    first_of_item: bool  # the item's first audible frame: its audio starts now
    item_drained: bool  # the item is complete and this was its last audio


class Playout:
    def __init__(self, fmt: OutputFormat = OutputFormat()) -> None:
        self.format = fmt
        self._buffer = np.zeros(0, np.int16)
        self._resampler: Resampler | None = None
        self._item_id: str | None = None
        self._item_complete = False
        self._played_samples = 0
        self._silence = np.zeros(fmt.frame_samples * fmt.channels, np.int16)
        self.paused = False  # silence is pulled; the queued audio waits where it stopped

    @property
    def item_id(self) -> str | None:
        return self._item_id

    @property
    def played_ms(self) -> int:
        """Milliseconds of the current item's audio pulled so far."""
        return 1000 * self._played_samples // self.format.sample_rate

    @property
    def queued_ms(self) -> int:
        return 1000 * (len(self._buffer) // self.format.channels) // self.format.sample_rate

    def begin_item(self, item_id: str) -> None:
        """Audio pushed from now on belongs to ``item_id`` (a new response)."""
        self.flush()
        self._item_id = item_id
        self._item_complete = False
        self._played_samples = 0
        self._resampler = Resampler(self.format.sample_rate, self.format.channels)

    def push(self, audio: np.ndarray, sample_rate: int) -> None:
        """Queue float32 mono agent audio at any rate (converted to the output format)."""
        if self._resampler is None or audio.size == 0:
            return
        self._append(self._resampler(np.asarray(audio, np.float32), sample_rate))

    def complete_item(self) -> None:
        """No more audio will come for the current item; queue the resampler's tail."""
        if self._resampler is not None and not self._item_complete:
            self._append(self._resampler.flush())
        self._item_complete = True

    def pause(self) -> int:
        """Hold the queued audio (a caller's onset while we listen); returns the ms played."""
        self.paused = True
        return self.played_ms

    def resume(self) -> None:
        self.paused = False

    def pull(self) -> PulledFrame:
        need = self.format.frame_samples * self.format.channels
        if self.paused:
            return PulledFrame(self._silence, None, False, False)
        if len(self._buffer) == 0:
            drained = self._item_id is not None and self._item_complete and self._played_samples > 0
            item = self._item_id if drained else None
            if drained:
                self._item_id = None
            return PulledFrame(self._silence, item, False, drained)
        pcm = self._buffer[:need]
        self._buffer = self._buffer[need:]
        first = self._played_samples == 0
        self._played_samples += len(pcm) // self.format.channels
        if len(pcm) < need:
            pcm = np.concatenate([pcm, self._silence[: need - len(pcm)]])
        return PulledFrame(pcm, self._item_id, first, False)

    def flush(self) -> int:
        """Drop all queued audio at once (barge-in); returns the ms of the item played."""
        played = self.played_ms
        self.paused = False
        self._buffer = np.zeros(0, np.int16)
        self._resampler = None
        self._item_id = None
        self._item_complete = False
        return played

    def _append(self, pcm: np.ndarray) -> None:
        if pcm.size:
            self._buffer = np.concatenate([self._buffer, pcm])

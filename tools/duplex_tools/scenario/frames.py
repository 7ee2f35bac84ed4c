"""How well the audio streams kept time in a recording: agent frames lost (gaps in the RTP
timestamps) or late, and stalls of our own microphone (a frame sent much later than the 20 ms
cadence: the client was too busy).

A frame is late when it arrived more than ``late_ms`` after the frame before it, beyond the
time between their places in the stream: a receiver that plays frames as they come (as ours
does, with no prefetch) runs dry there and the listener hears a drop-out. One stall counts
once, however long it is; the frames that then arrive in a burst are not late again."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from duplex_tools.scenario.recording import Recording

FRAME_SAMPLES = 960  # 20 ms at 48 kHz
RATE = 48000
_WRAP = 1 << 32  # RTP timestamps are 32-bit


@dataclass
class FrameQuality:
    heard: int  # agent frames received
    lost: int  # frames missing between those received
    late: int  # frames that arrived more than `late_ms` later than the cadence after the previous one
    max_lateness_ms: float  # the longest such delay
    mic_frames: int
    mic_stalls: int  # microphone frames sent more than one frame period late

    def to_json(self) -> dict:
        return asdict(self)


def frame_quality(rec: Recording, late_ms: float = 60.0) -> FrameQuality:
    lost, late, max_late = 0, 0, 0.0
    stamped = [(at, pts) for at, _, pts in rec.heard if pts is not None]
    if len(stamped) > 1:
        arrivals = np.array([at for at, _ in stamped])
        steps = np.mod(np.diff(np.array([pts for _, pts in stamped], dtype=np.int64)), _WRAP)
        lost = int(np.sum(np.maximum(steps // FRAME_SAMPLES - 1, 0)))
        excess = np.diff(arrivals) - steps / RATE
        late = int(np.sum(excess > late_ms / 1000))
        max_late = float(max(excess.max(), 0.0) * 1000)
    sent = np.array([at for at, _ in rec.sent])
    stalls = int(np.sum(np.diff(sent) > 2 * FRAME_SAMPLES / RATE)) if len(sent) > 1 else 0
    return FrameQuality(len(rec.heard), lost, late, round(max_late, 1), len(sent), stalls)

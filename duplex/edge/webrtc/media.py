"""WebRTC media <-> a session: decoded caller audio to the session's 16 kHz mono; session frames to a paced
48 kHz stereo track with continuous timestamps."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import cast

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from duplex.audio import SESSION_RATE, Resampler
from duplex.session.pacing import FramePacer
from duplex.session.playout import OutputFormat

log = logging.getLogger("duplex.edge")
WEBRTC_OUTPUT = OutputFormat(sample_rate=48000, channels=2, frame_ms=20)  # send stereo: mono is upmixed at -3 dB


class SessionAudioTrack(MediaStreamTrack):
    """The agent's voice: one 20 ms frame each time ``next_pcm`` gives one, pts advancing by
    exactly one frame each time (never reset). ``next_pcm`` sets the pace (``paced_pull``)."""

    kind = "audio"

    def __init__(self, next_pcm: Callable[[], Awaitable[np.ndarray]], fmt: OutputFormat = WEBRTC_OUTPUT) -> None:
        super().__init__()
        self._next_pcm = next_pcm
        self._format = fmt
        self._pts = 0
        self._time_base = Fraction(1, fmt.sample_rate)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pcm = await self._next_pcm()
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=self._format.layout)
        frame.sample_rate = self._format.sample_rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        self._pts += self._format.frame_samples
        return frame


def paced_pull(pull: Callable[[float], np.ndarray], fmt: OutputFormat = WEBRTC_OUTPUT
               ) -> Callable[[], Awaitable[np.ndarray]]:
    """The session's output, one frame per deadline on the monotonic clock (silence when there
    is nothing to say): ``pull`` is asked at each frame's due time."""
    pacer = FramePacer(fmt.frame_ms / 1000)

    async def next_pcm() -> np.ndarray:
        return pull(await pacer.wait_next())

    return next_pcm


class InputPump:
    """Reads the caller's track, converts to int16 mono at the session rate, hands it to ``push`` with the
    arrival time and its place in the stream. Ends when the track ends, or when ``push`` fails:
    then ``failed`` is told why (the call cannot hear its caller any more, so it must end, not
    sit in a turn that never ends)."""

    def __init__(self, track: MediaStreamTrack, push: Callable[[np.ndarray, float, int | None], None],
                 failed: Callable[[Exception], None]) -> None:
        self._track = track
        self._push = push
        self._failed = failed
        self._resampler = Resampler(SESSION_RATE)
        self.frames = 0

    async def run(self) -> None:
        while True:
            try:
                frame = cast(av.AudioFrame, await self._track.recv())  # an audio track's frames
            except MediaStreamError:
                return
            except asyncio.CancelledError:
                raise
            arrival = time.monotonic()
            self.frames += 1
            try:
                pcm = self._resampler.frame(frame)
            except (av.FFmpegError, ValueError) as exc:  # a broken frame is dropped, not fatal
                log.warning("dropping an undecodable audio frame: %s", exc)
                continue
            if not pcm.size:
                continue
            try:
                self._push(pcm, arrival, _stream_position(frame))
            except Exception as exc:
                log.exception("the session failed on the caller's audio")
                self._failed(exc)
                return


def _stream_position(frame: av.AudioFrame) -> int | None:
    """Where the frame belongs in the caller's stream, in session-rate samples (from its RTP
    timestamp): the session tells a hole in the stream from a frame that only waited."""
    if frame.pts is None or frame.time_base is None:
        return None
    return round(frame.pts * frame.time_base * SESSION_RATE)

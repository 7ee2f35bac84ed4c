"""The WebRTC door's input pump: a session that fails on the caller's audio ends the pump and
says so (the door then tells the client and ends the call), instead of leaving a call that
cannot hear its caller sitting in a turn that never ends."""

from __future__ import annotations

import asyncio

from aiortc.mediastreams import AudioStreamTrack

from duplex.edge.webrtc.media import InputPump


async def test_a_session_failure_ends_the_pump_and_is_reported():
    pushed: list[int] = []
    failures: list[Exception] = []

    def push(pcm, arrival, position):
        pushed.append(len(pcm))
        if len(pushed) == 3:
            raise ValueError("the session broke")

    track = AudioStreamTrack()  # aiortc's own silence source: 20 ms frames, paced
    pump = InputPump(track, push, failures.append)
    await asyncio.wait_for(pump.run(), timeout=5.0)  # returns: it does not raise, nor read on
    track.stop()
    assert len(pushed) == 3 and pump.frames == 3
    assert len(failures) == 1 and str(failures[0]) == "the session broke"

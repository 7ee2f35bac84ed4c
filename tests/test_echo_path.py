"""The test client's loudspeaker-to-microphone path: a fixed delay whatever order frames are
handled in, late frames lost, a stream that fell behind for good played later."""

from __future__ import annotations

import numpy as np

from duplex_tools.echo_path import FRAME, RATE, EchoPath

T0 = 50.0


def frame(n: int) -> np.ndarray:
    return np.full(FRAME, (n + 1) / 100, np.float32)  # each frame its own level, to tell them apart


def heard_level(path: EchoPath, at: float) -> float:
    return float(path.echo(at, FRAME)[FRAME // 2]) / path.gain


def test_the_delay_is_fixed_whether_frames_arrive_evenly_or_in_bursts():
    even, bursty = EchoPath(0.5), EchoPath(0.5)
    for n in range(50):
        even.received(frame(n), n * FRAME, T0 + n * FRAME / RATE)
        burst_arrival = T0 + (n - n % 3) * FRAME / RATE + 0.04 * (n % 3 == 0 and n > 0)
        bursty.received(frame(n), n * FRAME, max(burst_arrival, T0))
    for n in range(5, 45):
        at = T0 + 0.06 + 0.01 + n * FRAME / RATE  # buffer + acoustic delay after frame n's slot
        assert heard_level(even, at) == heard_level(bursty, at) == np.float32((n + 1) / 100)


def test_a_frame_after_its_turn_is_lost_and_the_delay_stays():
    path = EchoPath(0.5)
    for n in range(20):
        late = 0.1 if n == 10 else 0.0
        path.received(frame(n), n * FRAME, T0 + n * FRAME / RATE + late)
    assert path.lost == 1 and path.restarts == 0
    assert heard_level(path, T0 + 0.07 + 10 * FRAME / RATE) == 0.0
    assert heard_level(path, T0 + 0.07 + 11 * FRAME / RATE) == np.float32(12 / 100)


def test_a_stream_lastingly_behind_is_played_later_from_then_on():
    path = EchoPath(0.5)
    for n in range(40):
        behind = 0.15 if n >= 20 else 0.0  # its sender skipped ahead 150 ms of wall time
        path.received(frame(n), n * FRAME, T0 + n * FRAME / RATE + behind)
    assert path.restarts == 1 and path.lost == 4
    assert heard_level(path, T0 + 0.07 + 0.15 + 30 * FRAME / RATE) == np.float32(31 / 100)

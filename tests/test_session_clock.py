"""The input clock: where each caller frame sits on the monotonic clock, through jitter, stalls
of our own loop (a backlog arriving in a burst), holes in the stream and a sender's clock jump."""

from __future__ import annotations

import numpy as np
import pytest

from duplex.session.clock import MAX_HOLE_S, SETTLE_S, InputClock, InputFrames

RATE = 16000
FRAME = 320  # 20 ms
T0 = 1000.0


def captured(n: int) -> float:
    """When frame ``n`` of an undisturbed stream was complete."""
    return T0 + (n + 1) * FRAME / RATE


def test_jitter_only_delays_and_never_moves_the_times():
    clock = InputClock(RATE)
    lateness = np.random.default_rng(1).uniform(0, 0.05, 200)
    lateness[0] = 0.0
    for n in range(200):
        end = clock.advance(FRAME, captured(n) + lateness[n], position=n * FRAME)
        assert end == pytest.approx(captured(n), abs=1e-9)


@pytest.mark.parametrize("with_positions", [True, False])
def test_a_stalled_loop_bursting_its_backlog_keeps_every_frame_in_place(with_positions):
    """Frames 50-64 wait behind a 300 ms stall and then arrive together. With positions they
    keep their capture times; without, the first late frame looks like a hole (the old clock)."""
    clock = InputClock(RATE)
    stall_end = captured(64) + 0.001
    times = []
    for n in range(120):
        arrival = stall_end if 50 <= n <= 64 else captured(n)
        times.append(clock.advance(FRAME, arrival, n * FRAME if with_positions else None))
    errors = np.abs(np.array(times) - np.array([captured(n) for n in range(120)]))
    if with_positions:
        assert errors.max() < 1e-9
    else:
        assert errors[50] > 0.25, "without positions, lateness past the gap limit reads as a hole"


def test_a_hole_in_the_stream_is_filled_with_its_silence_and_times_continue():
    frames = InputFrames()
    out = []
    for n in [*range(10), *range(13, 20)]:  # frames 10-12 were lost
        chunk = np.full(FRAME, 1000 + n, np.int16)
        out += frames.push(chunk, captured(n) + 0.002, FRAME, position=n * FRAME)
    assert len(out) == 20
    assert [float(f[0]) for f, _ in out[10:13]] == [0.0, 0.0, 0.0]
    assert int(out[13][0][0]) == 1013
    for n, (_, end) in enumerate(out):
        assert end == pytest.approx(captured(n) + 0.002, abs=1e-9)  # a constant delay is part of the anchor


def test_a_sender_whose_clock_jumped_is_followed_once_the_lateness_has_lasted():
    """The sender skipped 250 ms of wall time but not of stream positions (its pacer re-anchored):
    every later frame is 250 ms late. The clock follows once no arrival for SETTLE_S was on time."""
    clock = InputClock(RATE)
    jump = 0.25
    last_on_time = captured(99)
    for n in range(100 + 2 * int(SETTLE_S * RATE / FRAME)):
        arrival = captured(n) + (jump if n >= 100 else 0.0)
        end = clock.advance(FRAME, arrival, n * FRAME)
        if arrival <= last_on_time + SETTLE_S:
            assert end == pytest.approx(captured(n), abs=1e-9), n
    assert end == pytest.approx(captured(n) + jump, abs=1e-9)


def test_after_a_long_hole_the_clock_starts_over_at_the_next_arrival():
    clock = InputClock(RATE)
    for n in range(10):
        clock.advance(FRAME, captured(n), n * FRAME)
    resume = 10 + int(2 * MAX_HOLE_S * RATE / FRAME)
    arrival = captured(resume) + 0.3  # late as well: the stream restarted, nothing to learn from lateness
    assert clock.advance(FRAME, arrival, resume * FRAME) == pytest.approx(arrival, abs=1e-9)
    assert clock.samples == 11 * FRAME  # the hole was not filled


def test_without_positions_a_late_chunk_moves_the_clock_forward_at_once():
    """SIP and Twilio hand no positions yet: lateness past the gap limit is a hole (DTX)."""
    clock = InputClock(RATE)
    for n in range(10):
        clock.advance(FRAME, captured(n))
    arrival = captured(10) + 0.5
    assert clock.advance(FRAME, arrival) == pytest.approx(arrival, abs=1e-9)

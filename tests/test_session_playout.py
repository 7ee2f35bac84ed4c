"""Output side of a session: playout buffer, truncation point, frame pacing."""

from __future__ import annotations

import numpy as np

from duplex.session.pacing import FramePacer
from duplex.session.playout import OutputFormat, Playout


def tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_agent_audio_comes_out_as_20ms_stereo_frames_then_silence():
    playout = Playout(OutputFormat(48000, 2, 20))
    playout.begin_item("item_1")
    for _ in range(5):
        playout.push(tone(0.1, 24000), 24000)  # streamed in chunks at the model's rate
    playout.complete_item()
    frames = [playout.pull() for _ in range(40)]
    audible = [f for f in frames if np.abs(f.pcm).max() > 1000]
    assert all(f.pcm.shape == (1920,) and f.pcm.dtype == np.int16 for f in frames)
    assert abs(len(audible) - 25) <= 1  # 0.5 s of audio = 25 frames
    left, right = audible[3].pcm[0::2], audible[3].pcm[1::2]
    assert np.array_equal(left, right)  # stereo, both channels carry the voice
    assert frames[0].first_of_item and not any(f.first_of_item for f in frames[1:])
    assert [i for i, f in enumerate(frames) if f.item_drained] == [len(audible)]
    assert all(f.item_id is None for f in frames[len(audible) + 1:])
    assert abs(playout.played_ms - 500) <= 20


def test_flush_cuts_at_once_and_reports_what_was_played():
    playout = Playout()
    playout.begin_item("item_2")
    playout.push(tone(2.0, 16000), 16000)
    for _ in range(10):
        playout.pull()
    assert playout.flush() == 200
    after = playout.pull()
    assert np.abs(after.pcm).max() == 0 and after.item_id is None and not after.item_drained
    playout.push(tone(0.5, 16000), 16000)  # late chunks of the cancelled item are not played
    assert playout.queued_ms == 0 and np.abs(playout.pull().pcm).max() == 0


class SlowClock:
    """The pacer's clock and sleep: time moves only when it sleeps, and every sleep overshoots by
    ``late_s`` (a loaded event loop wakes late), so the test controls what the pacer sees."""

    def __init__(self, late_s: float = 0.0) -> None:
        self.now = 50.0
        self.late_s = late_s

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late_s


async def test_pacer_keeps_a_drift_free_20ms_grid_when_it_wakes_late():
    clock = SlowClock(late_s=0.007)  # later than a frame's slack would allow to add up
    pacer = FramePacer(0.02, clock=clock, sleep=clock.sleep)
    dues = [await pacer.wait_next() for _ in range(25)]
    assert np.allclose(np.diff(dues), 0.02, atol=1e-9)  # deadlines are anchor + n * 20 ms exactly
    assert pacer.reanchors == 0 and clock.now - dues[0] < 25 * 0.02 + 0.007 + 1e-9  # no drift added up


async def test_pacer_reanchors_after_a_stall_instead_of_bursting():
    clock = SlowClock()
    pacer = FramePacer(0.02, max_lag_s=0.1, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        await pacer.wait_next()
    clock.now += 0.3  # the event loop was blocked (a stall)
    stalled = clock.now
    resumed = await pacer.wait_next()
    burst = [await pacer.wait_next() for _ in range(3)]
    assert pacer.reanchors == 1 and resumed == stalled  # a fresh grid from the stall's end
    assert np.allclose(np.array(burst) - resumed, [0.02, 0.04, 0.06])  # paced again, not sent at once


async def test_run_ticks_once_per_frame_at_its_due_time_until_the_tick_says_stop():
    clock = SlowClock(late_s=0.003)
    pacer = FramePacer(0.02, clock=clock, sleep=clock.sleep)
    ticks: list[tuple[float, float]] = []  # (due, the clock when the tick ran)

    async def tick(due: float) -> bool:
        ticks.append((due, clock.now))
        return len(ticks) == 10

    await pacer.run(tick)
    dues = np.array([due for due, _ in ticks])
    assert len(ticks) == 10  # it stopped at the tick that said so, not before, not after
    assert np.allclose(np.diff(dues), 0.02, atol=1e-9)
    assert all(now >= due for due, now in ticks)  # never early

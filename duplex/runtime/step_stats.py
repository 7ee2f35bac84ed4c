"""Step times and audio made, per stage, kept always (cheap: a few integer adds per step) and
reported with the stage's stats (``messages.StageStats.steps``), so a scraper gets per stage
step-time histograms and a real-time factor without tracing being on (``steptrace`` is the
opt-in, per-step record for benches).

A scheduler's compute thread observes; the host thread snapshots. Counts are plain ints under
the GIL: a snapshot taken mid-step may miss that one step, never corrupt a count."""

from __future__ import annotations

import bisect

import msgspec

# Upper bounds (seconds) of the step-time buckets: a tiny model's step is ~1 ms, a vocoder's or a
# prefill's up to seconds. Fixed, so every stage's histogram has the same buckets.
STEP_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class StepHistogram(msgspec.Struct, frozen=True):
    """Cumulative since the stage started: ``counts[i]`` steps took at most ``STEP_BUCKETS_S[i]``
    (not cumulative over buckets: one count per bucket, the last one for longer steps)."""

    counts: list[int]
    sum_s: float
    audio_s: float = 0.0  # seconds of agent audio this stage emitted

    @property
    def steps(self) -> int:
        return sum(self.counts)


class StepTimes:
    def __init__(self) -> None:
        self._counts = [0] * (len(STEP_BUCKETS_S) + 1)
        self._sum_s = 0.0
        self._audio_s = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(STEP_BUCKETS_S, seconds)] += 1
        self._sum_s += seconds

    def made_audio(self, seconds: float) -> None:
        self._audio_s += seconds

    def snapshot(self) -> StepHistogram:
        return StepHistogram(counts=list(self._counts), sum_s=self._sum_s, audio_s=self._audio_s)

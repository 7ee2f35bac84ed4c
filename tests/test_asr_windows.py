"""The streaming ASR's encoder window is fitted to the utterance, finals that share a window are
one model call, and a short window's loop is cut (``duplex/models/local/asr.py``). Pure policy:
a transcriber that records its calls stands in for Whisper here; test_local_models.py checks the
same on the real weights (the words equal the 7 s window's)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from duplex.config.pipeline import StageConfig
from duplex.models.local.asr import Heard, LoopGuard, StreamingASR, StreamingPolicy, first_copy
from duplex.models.local.stages import build_asr
from duplex.runtime.contract import CallerAudio, Transcript, WorkItem
from tests.local_helpers import Ctx

RATE = 16000
FRAME_MS = 20


class RecordingTranscriber:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (clips, window frames) per call

    def hear(self, clips: list[np.ndarray], window_frames: int) -> list[Heard]:
        self.calls.append((len(clips), window_frames))
        return [Heard(f"words {len(clip)}", no_speech_prob=0.0, avg_logprob=-0.1) for clip in clips]


def _window_s(policy: StreamingPolicy, seconds: float) -> float:
    asr = StreamingASR(RecordingTranscriber(), policy)  # type: ignore[arg-type]
    return asr._window_frames({"audio": np.zeros(round(seconds * RATE), np.float32), "committed": 0}) / 100


@pytest.mark.parametrize(("seconds", "window_s"), [(0.4, 3.0), (1.9, 3.0), (2.1, 4.0), (3.0, 4.0), (3.1, 5.0),
                                                   (6.6, 8.0), (29.5, 30.0), (45.0, 30.0)])
def test_the_window_is_the_utterance_plus_its_margin_in_whole_seconds(seconds, window_s):
    assert _window_s(StreamingPolicy(), seconds) == window_s


def test_the_old_fixed_window_is_a_setting_away():
    old = StreamingPolicy(min_window_s=7.0, window_step_s=5.0, window_margin_s=0.5)
    assert [_window_s(old, s) for s in (0.5, 2.0, 4.4, 6.6, 12.0)] == [7.0, 7.0, 7.0, 10.0, 15.0]


def _speech(seconds: float) -> CallerAudio:
    frames = round(seconds * 1000 / FRAME_MS)
    return CallerAudio(np.full(frames * RATE * FRAME_MS // 1000, 0.1, np.float32), [True] * frames, FRAME_MS)


def test_finals_that_end_together_share_one_call_per_window():
    transcriber = RecordingTranscriber()
    asr = StreamingASR(transcriber)  # type: ignore[arg-type]
    lengths = [1.5, 1.8, 1.6, 2.6]  # three fit a 3 s window, the last one a 4 s window
    items = [WorkItem(f"r{n}", "client", _speech(s), eos=True) for n, s in enumerate(lengths)]
    out = asr(items, [{} for _ in items])
    assert sorted(transcriber.calls) == [(1, 400), (3, 300)]
    expected = [Transcript(f"words {round(s * RATE)}", final=True, avg_logprob=-0.1, no_speech_prob=0.0)
                for s in lengths]
    assert [emitted[-1] for emitted in out] == expected


@pytest.mark.parametrize(("tokens", "kept"), [
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4], [1, 2, 3, 4]),  # "Wait, stop. Wait, stop. Wait, stop."
    ([1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [1, 2, 3, 4, 5, 6]),  # cut by the token cap in its second copy
    ([9, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3], [9, 8, 1, 2, 3]),  # the loop starts after other words
    ([7, 1, 2], [7, 1, 2]),  # "Yes." once
    ([1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 1, 2]),  # two tokens again: too little to call a loop
    ([1, 2, 3, 2, 3, 4], [1, 2, 3, 2, 3, 4]),  # a repeat in the middle is speech
])
def test_a_transcript_that_starts_repeating_itself_keeps_its_first_copy(tokens, kept):
    assert first_copy(tokens) == kept


def test_the_loop_guard_holds_short_windows_only_and_caps_by_window_length():
    guard = LoopGuard(below_s=5.0, repetition_penalty=1.3, tokens_per_s=8.0)
    assert [guard.penalty(w) for w in (3.0, 4.0, 5.0, 30.0)] == [1.3, 1.3, 1.0, 1.0]
    assert [guard.max_tokens(w) for w in (0.5, 3.0, 30.0)] == [8, 24, 240]


@pytest.mark.parametrize(("arg", "value"),
                         [("window_step_s", 0), ("min_window_s", "wide"), ("repetition_penalty", 0.5)])
def test_a_bad_window_or_guard_arg_is_refused_by_name_before_the_model_loads(arg, value):
    stage = StageConfig(name="asr", builder="local.asr", scheduler={"kind": "simple"}, args={arg: value})
    with pytest.raises(ValidationError, match=arg):
        build_asr(Ctx(stage, memory_bytes=None))

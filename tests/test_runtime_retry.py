"""A batch with one bad row: the ``simple`` scheduler retries its rows one by one, and each good
row's input counts once. The real streaming ASR and TTS computations change a request's state
before their model call (the ASR appends the audio, the TTS pushes the text into its phrase
splitter); only the model is replaced, by one that fails for a marked row."""

from __future__ import annotations

import threading

import numpy as np

from duplex.config.pipeline import StageConfig
from duplex.models.local.asr import Heard, StreamingASR
from duplex.models.local.stages import StreamingTTS
from duplex.runtime.contract import AgentAudio, AgentText, Transcript
from duplex.runtime.scheduler import Scheduler, WorkItem
from duplex.runtime.schedulers.simple import SimpleScheduler
from tests.local_helpers import caller_audio, collect, silence, speak

BATCHED = {"kind": "simple", "max_batch_size": 8}


def _run(stage: StageConfig, computation, items: list[WorkItem]) -> dict:
    """Queue every item before the loop starts, so the first batch holds each request's first
    item (a batch never holds two of one request) and the second batch their last ones."""
    scheduler: Scheduler = SimpleScheduler(stage, computation)
    for item in items:
        scheduler.inbox.put(item)
    scheduler.start()
    try:
        return collect(scheduler, {item.request_id for item in items}, timeout=60)
    finally:
        scheduler.stop()


# -- TTS ----------------------------------------------------------------------------------------
class SpellingSynth:
    """Speaks a phrase as its character codes (so the test reads back what was spoken) and
    fails on a phrase that contains ``MARK``."""

    MARK = "Boom"
    sample_rate = 16000

    def synthesize(self, phrase: str) -> np.ndarray:
        if self.MARK in phrase:
            raise RuntimeError(f"cannot say {phrase!r}")
        return np.frombuffer(phrase.encode(), np.uint8).astype(np.float32)


def _spoken(emits) -> str:
    return " ".join(bytes(e.data.samples.astype(np.uint8)).decode() for e in emits if isinstance(e.data, AgentAudio))


def test_a_failed_batch_retries_tts_rows_without_pushing_their_text_twice():
    stage = StageConfig(name="tts", builder="local.tts", scheduler=BATCHED)
    good = ["g0", "g1", "g2"]
    first = [WorkItem(rid, "thinker", AgentText("Regular or"), eos=False) for rid in good]
    first.insert(1, WorkItem("bad", "thinker", AgentText(f"{SpellingSynth.MARK}."), eos=True))  # fails the batch
    last = [WorkItem(rid, "thinker", AgentText(" large?"), eos=True) for rid in good]
    emits = _run(stage, StreamingTTS(SpellingSynth()), first + last)
    assert [e.error is not None for e in emits["bad"]] == [True]
    for rid in good:
        assert [e.error for e in emits[rid]] == [None] and _spoken(emits[rid]) == "Regular or large?", rid


# -- ASR ----------------------------------------------------------------------------------------
class CountingTranscriber:
    """Transcribes a clip as the number of samples it heard; like a real model it has a longest
    clip it takes, and a batch with a longer clip fails as a whole."""

    longest = 3 * 16000

    def hear(self, clips: list[np.ndarray], window_frames: int) -> list[Heard]:
        if any(len(clip) > self.longest for clip in clips):
            raise ValueError("clip too long")
        return [Heard(f"heard {len(clip)}", no_speech_prob=0.0, avg_logprob=-0.1) for clip in clips]


def test_a_failed_batch_retries_asr_rows_without_appending_their_audio_twice():
    stage = StageConfig(name="asr", builder="local.asr", scheduler=BATCHED)
    speech = np.concatenate([speak("One bubble tea, please."), silence(0.5)])
    assert len(speech) <= CountingTranscriber.longest
    too_long = np.concatenate([speech, silence(1.0)])  # same encoder window as the others
    good = ["g0", "g1", "g2"]
    (speech_chunk,), (too_long_chunk,) = caller_audio([speech]), caller_audio([too_long])
    first = [WorkItem(rid, "client", speech_chunk, eos=False) for rid in good]
    first.insert(1, WorkItem("bad", "client", too_long_chunk, eos=False))
    last = [WorkItem(rid, "client", None, eos=True) for rid in good]
    emits = _run(stage, StreamingASR(CountingTranscriber()), first + last)
    assert [e.error is not None for e in emits["bad"]] == [True]
    for rid in good:
        assert [e.error for e in emits[rid] if e.error] == [], rid
        assert all(isinstance(e.data, Transcript) for e in emits[rid])
        texts = [e.data.text for e in emits[rid]]
        assert texts[-1] == f"heard {len(speech_chunk.samples)}" and set(texts) == {texts[-1]}, (rid, texts)


# -- a state that cannot be copied ---------------------------------------------------------------
class KeepsALock:
    """Breaks the plain-data rule (a lock in its state): its rows must still each count once."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[str]]:
        self.batch_sizes.append(len(items))
        for item, state in zip(items, states):
            state.setdefault("lock", threading.Lock())
            state["text"] = state.get("text", "") + item.data.text
        return [[state["text"]] if item.eos else [] for item, state in zip(items, states)]


def test_rows_whose_state_cannot_be_copied_run_one_at_a_time():
    stage = StageConfig(name="tts", builder="local.tts", scheduler=BATCHED)
    computation = KeepsALock()
    rows = ["a", "b", "c"]
    first = [WorkItem(rid, "thinker", AgentText("one "), eos=False) for rid in rows]
    last = [WorkItem(rid, "thinker", AgentText("two"), eos=True) for rid in rows]
    emits = _run(stage, computation, first + last)
    assert all([e.data for e in emits[rid]] == ["one two"] for rid in rows)
    assert computation.batch_sizes[0] == 3 and set(computation.batch_sizes[1:]) == {1}

"""Shared by the `local` pipeline tests: speech made at test time with Piper, and a real
scheduler driven in-process with bounded waits."""

from __future__ import annotations

import select
import time
from typing import Any

import numpy as np

from duplex.config.pipeline import StageConfig
from duplex.models.local.assets import piper_voice_paths
from duplex.models.local.audio import resample
from duplex.models.local.tts import PiperSynth
from duplex.runtime.scheduler import Emit, Scheduler, WorkItem

ORDER = "I would like a bubble tea with less ice."


def speak(text: str, rate: int = 16000) -> np.ndarray:
    """``text`` as 16 kHz speech, the same samples on every run (Piper without its noise)."""
    synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
    return resample(synth.synthesize(text), synth.sample_rate, rate)


def word_recall(expected: str, heard: str) -> float:
    """Share of the expected words found in what was heard (order-free, punctuation-free)."""
    clean = lambda text: "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()  # noqa: E731
    wanted, got = clean(expected), set(clean(heard))
    return sum(word in got for word in wanted) / max(len(wanted), 1)


def chunks(audio: np.ndarray, seconds: float = 0.1, rate: int = 16000) -> list[np.ndarray]:
    step = int(seconds * rate)
    return [audio[i : i + step] for i in range(0, len(audio), step)]


def silence(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


class Ctx:
    """The BuildContext a stage host passes to a builder."""

    def __init__(self, stage: StageConfig, memory_bytes: int | None, threads: int = 1) -> None:
        self.stage, self.device, self.memory_bytes, self.threads = stage, "cpu", memory_bytes, threads


def collect(scheduler: Scheduler, request_ids: set[str], timeout: float = 120.0) -> dict[str, list[Emit]]:
    """Emits per request until each has its eos (or error) emit; fails after ``timeout``."""
    emits: dict[str, list[Emit]] = {rid: [] for rid in request_ids}
    open_ids = set(request_ids)
    deadline = time.monotonic() + timeout
    while open_ids:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"requests {sorted(open_ids)} did not finish within {timeout}s")
        select.select([scheduler.outbox.wake_fd], [], [], min(remaining, 0.5))
        for emit in scheduler.outbox.drain():
            if emit.request_id == "*":
                raise AssertionError(f"scheduler crashed: {emit.error}")
            emits.setdefault(emit.request_id, []).append(emit)
            if emit.eos or emit.error:
                open_ids.discard(emit.request_id)
    return emits


def wait_until(check, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def user_turn(request_id: str, text: str, session_id: str, **params: Any) -> WorkItem:
    """What the asr stage hands the thinker at the end of a user turn."""
    return WorkItem(request_id, "asr", {"user_text": text, "user_text_final": True}, eos=True,
                    params={"session_id": session_id, **params})


def reply_text(emits: list[Emit]) -> str:
    return "".join(e.data["text"] for e in emits if not e.eos and e.data and "text" in e.data)


def gemma_thinker_stage(max_new_tokens: int) -> StageConfig:
    """The local thinker as the model tests run it: two KV slots, short replies."""
    return StageConfig(name="thinker", builder="local.thinker", scheduler={"kind": "ar", "max_running_requests": 2},
                       args={"max_len": 768, "max_new_tokens": max_new_tokens})


def build_gemma_thinker(stage: StageConfig):
    from duplex.models.local.stages import build_thinker

    return build_thinker(stage, Ctx(stage, memory_bytes=2 * 2**30))


def running_ar_scheduler(stage: StageConfig, runner):
    """An ``ar`` scheduler started around ``runner``; a generator for a pytest fixture."""
    from duplex.runtime.schedulers.ar import ARScheduler

    scheduler = ARScheduler(stage, runner)
    scheduler.start()
    yield scheduler
    scheduler.stop()

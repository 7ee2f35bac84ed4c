"""Shared by the `local` pipeline tests: speech made at test time with Piper, and a real
scheduler driven in-process with bounded waits."""

from __future__ import annotations

import select
import time
from typing import Any

import numpy as np

from duplex.audio import resample
from duplex.config.pipeline import StageConfig
from duplex.config.session import VadConfig
from duplex.models.local.assets import piper_voice_paths
from duplex.models.local.tts import PiperSynth
from duplex.runtime.contract import AgentText, BuildContext, CallerAudio, Heard, Transcript, TurnRequest
from duplex.runtime.scheduler import Emit, Scheduler, WorkItem
from duplex.session.vad import FrameClassifier

ORDER = "I would like a bubble tea with less ice."
# Said over a reply to cut it: voiced well past barge_in.interrupt_ms, so the sound alone decides
# the interruption (Piper's "Wait, stop." is 520 ms voiced with a pause after "Wait,": that one
# is decided by its words, and a loaded box may hear them after words_wait_ms and resume).
INTERRUPTION = "Wait, stop. I want a mango tea instead."


def speak(text: str, rate: int = 16000) -> np.ndarray:
    """``text`` as 16 kHz speech, the same samples on every run (Piper without its noise)."""
    synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
    return resample(synth.synthesize(text), synth.sample_rate, rate)


def word_recall(expected: str, heard: str) -> float:
    """Share of the expected words found in what was heard (order-free, punctuation-free)."""
    clean = lambda text: "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()
    wanted, got = clean(expected), set(clean(heard))
    return sum(word in got for word in wanted) / max(len(wanted), 1)


def chunks(audio: np.ndarray, seconds: float = 0.1, rate: int = 16000) -> list[np.ndarray]:
    step = int(seconds * rate)
    return [audio[i : i + step] for i in range(0, len(audio), step)]


def silence(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


def Ctx(stage: StageConfig, memory_bytes: int | None, threads: int = 1) -> BuildContext:
    """The BuildContext a stage host passes to a builder."""
    return BuildContext(stage=stage.name, args=dict(stage.args), memory_bytes=memory_bytes, threads=threads,
                        max_running_requests=getattr(stage.scheduler, "max_running_requests", 1))


def voiced_ms(audio: np.ndarray, rate: int, vad: VadConfig | None = None) -> int:
    """Voiced audio in ``audio`` (float, any rate) as the session's classifier hears it."""
    (chunk,) = caller_audio([resample(audio, rate, 16000)], vad)
    return chunk.frame_ms * sum(chunk.voiced)


def caller_audio(pieces: list[np.ndarray], vad: VadConfig | None = None) -> list[CallerAudio]:
    """Float 16 kHz chunks as the session feeds them: whole VAD frames, each with the session's
    classifier's verdict (one classifier over the whole stream, as in a session)."""
    vad = vad or VadConfig()
    classifier = FrameClassifier(vad)
    frame = classifier.frame_samples
    out, carry = [], np.zeros(0, np.float32)
    for piece in pieces:
        audio = np.concatenate([carry, np.asarray(piece, np.float32)])
        whole = len(audio) - len(audio) % frame
        carry = audio[whole:]
        pcm = (np.clip(audio[:whole], -1, 1) * 32767).astype(np.int16)
        voiced = [classifier.is_voiced(pcm[i:i + frame]) for i in range(0, whole, frame)]
        out.append(CallerAudio(audio[:whole], voiced, vad.frame_ms))
    return out


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
        if scheduler.outbox.crash is not None:
            raise AssertionError(f"scheduler crashed: {scheduler.outbox.crash}")
        for emit in scheduler.outbox.drain():
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


def user_turn(request_id: str, text: str, session_id: str, heard: Heard | None = None, **fields: Any) -> WorkItem:
    """What the asr stage hands the thinker at the end of a user turn."""
    return WorkItem(request_id, "asr", Transcript(text, final=True), eos=True,
                    params=TurnRequest(session_id=session_id, heard=heard, **fields))


def reply_text(emits: list[Emit]) -> str:
    return "".join(e.data.text for e in emits if isinstance(e.data, AgentText))


def gemma_thinker_stage(max_new_tokens: int) -> StageConfig:
    """The local thinker as the model tests run it: two KV slots, short replies."""
    return StageConfig(name="thinker", builder="local.thinker", scheduler={"kind": "ar", "max_running_requests": 2},
                       args={"max_len": 768, "max_new_tokens": max_new_tokens})


def build_gemma_thinker(stage: StageConfig):
    from duplex.models.local.stages import build_thinker

    return build_thinker(Ctx(stage, memory_bytes=2 * 2**30))


def running_ar_scheduler(stage: StageConfig, runner):
    """An ``ar`` scheduler started around ``runner``; a generator for a pytest fixture."""
    from duplex.runtime.schedulers.ar import ARScheduler

    scheduler = ARScheduler(stage, runner)
    scheduler.start()
    yield scheduler
    scheduler.stop()

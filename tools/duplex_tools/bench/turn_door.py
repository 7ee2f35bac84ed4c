"""The corpus end to end through a real door: a stratified sample of its clips (the very ``Clip``
objects the in-process evaluation judges), each played as one call by a real aiortc peer against
a real ``duplex serve`` with the scenario machinery (``duplex_tools.scenario``).

Each clip becomes a scenario (its audio written to a WAV):

- an overlap (backchannel, noise, interruption): the caller asks a question that gets a long-ish
  answer and, once 1 s of it was heard, the clip plays over it; a take-over is the reply cut (for
  an interruption that is honouring it), as in process, where it is the interrupting verdict;
- a pause: the clip's sentence in two parts, cut where the caller goes on after the pause (the
  first voiced frame after it, as in process); a take-over is a reply started before the second
  part began, i.e. the turn ended before the caller went on, as in process;
- a complete turn (smooth): the clip alone, played twice, once with the server's own turn
  detection and once with silence-ended turns (``server_vad``), the order alternating clip by
  clip; a take-over is the turn answered, its latency end of speech -> the answer heard. The two
  side by side say whether reading the turn's meaning costs the caller waiting.

The clip plays from its sound's start to its end (the render's lead and tail of room tone are
left out, so the client's onset and end of speech are the clip's own). Latencies: an
interruption's onset -> agent silent; end of speech -> the agent's answer (a pause clip's whole
sentence; a complete turn; an interruption's words)."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from duplex.config.session import VadConfig
from duplex_tools.harness import write_wav
from duplex_tools.scenario.measure import ScenarioResult, measure
from duplex_tools.scenario.model import PIPER, Scenario
from duplex_tools.scenario.runner import run_scenario
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.evaluate import resumes_at
from duplex_tools.turn_corpus.render import Rendered, render
from duplex_tools.turn_corpus.simulate import frames_of

CATEGORIES = ("pause", "backchannel", "noise", "interruption", "smooth")  # Full-Duplex-Bench's, at the door
# a condition's class: the sample is stratified over these (two noise levels are one class)
CONDITION_CLASSES = {"clean": "clean", "snr20": "noisy", "snr10": "noisy", "room": "room", "phone": "phone"}
# the question the end-to-end bench asks too: the bundled pipelines answer it at some length
QUESTION = "Could you tell me a little about your menu today?"
OVERLAP_AT = {"agent_heard_s": 1.0}
RATE = 16000  # the corpus' audio
NOT_SPEAKING = "the agent was not speaking at the clip's onset"  # the call's void: the clip overlapped nothing
# how a call's turns end: the server's own way (the one under test), and silence-ended turns, the
# baseline a complete turn is played against in the same run
DEFAULT_TURNS, SILENCE_TURNS = "default", "silence"
TURNS: dict[str, dict | None] = {DEFAULT_TURNS: None, SILENCE_TURNS: {"turn_detection": {"type": "server_vad"}}}


@dataclass(frozen=True)
class DoorCall:
    """One clip's call, judged."""

    clip: spec.Clip
    takeover: bool | None  # None: the call says nothing about it (``void`` says why)
    stop_ms: float | None = None  # interruption: the clip's onset -> the agent silent at the client
    answer_ms: float | None = None  # end of the caller's speech -> the agent's answer heard
    left_nothing: bool = True  # every stage let go of the cut reply and was empty after the call
    void: str | None = None
    seconds: float = 0.0  # the call's wall time
    turns: str = DEFAULT_TURNS  # how its turns ended (TURNS): only complete turns are also played with silence

    @property
    def latency_ms(self) -> float | None:
        """The category's latency, as the in-process report has one per outcome."""
        return self.stop_ms if self.clip.category == "interruption" else self.answer_ms


def sample(part: str, calls_per_cell: int, seed: int, categories: tuple[str, ...] = CATEGORIES) -> list[spec.Clip]:
    """``calls_per_cell`` clips of every (category, variant, condition class) of ``part``, chosen
    with ``seed`` among its speakers and the class's conditions; every cell's first call comes
    before any cell's second, so the first n of the list spread over the cells."""
    rng = random.Random(seed)
    cells: dict[tuple[str, str, str], list[spec.Clip]] = {}
    for clip in spec.clips(part, full=True, categories=categories):
        cells.setdefault((clip.category, clip.variant, CONDITION_CLASSES[clip.condition]), []).append(clip)
    chosen = [rng.sample(clips, min(calls_per_cell, len(clips))) for clips in cells.values()]
    rng.shuffle(chosen)
    return [clips[k] for k in range(calls_per_cell) for clips in chosen if k < len(clips)]


def _wav(folder: Path, name: str, samples: np.ndarray) -> str:
    path = folder / f"{name}.wav"
    write_wav(path, samples.astype(np.float32) / 32768.0, RATE)
    return str(path)


def resume_sample(rendered: Rendered) -> int:
    """Where a pause clip's caller goes on: the first voiced frame after the pause, as in process
    (the clip plays as two parts cut there, and a reply before the second is a take-over)."""
    assert rendered.pause_at is not None  # every pause clip has one
    resume = resumes_at(frames_of(rendered, VadConfig()), rendered.pause_at) * RATE // 1000
    return resume if rendered.pause_at < resume < rendered.end else rendered.pause_at + int(spec.PAUSE_S * RATE)


def scenario_of(clip: spec.Clip, rendered: Rendered, folder: Path, voice: str = PIPER,
                turns: str = DEFAULT_TURNS) -> Scenario:
    """The call that plays ``clip`` (its WAVs written to ``folder``); ``voice`` asks the question;
    ``turns``: how the call's turns end (TURNS)."""
    folder.mkdir(parents=True, exist_ok=True)
    audio = rendered.audio
    if clip.category == "pause":
        resume = resume_sample(rendered)
        steps = [{"wav": _wav(folder, "before", audio[rendered.start:resume]), "expect": {"reply": False}},
                 {"wav": _wav(folder, "after", audio[resume:rendered.end]), "expect": {"reply": True}}]
    elif clip.category == "smooth":
        steps = [{"wav": _wav(folder, "turn", audio[rendered.start:rendered.end]), "expect": {"reply": True}}]
    else:
        steps = [{"say": QUESTION, "voice": voice, "expect": {"reply": True}},
                 {"wav": _wav(folder, "clip", audio[rendered.start:rendered.end]), "at": OVERLAP_AT,
                  "label": f"{clip.category}: {clip.variant}",
                  "expect": {"interrupts": clip.category == "interruption"}}]
    # hung up once judged: the rest of the reply would only cost time; every stage is checked empty after
    return Scenario.model_validate({"name": clip.key, "steps": steps, "hang_up": "judged", "session": TURNS[turns],
                                    "expect": {"max_false_interruptions": None}})


def judge(clip: spec.Clip, result: ScenarioResult, seconds: float = 0.0, turns: str = DEFAULT_TURNS) -> DoorCall:
    checks = [*result.checks, *(c for step in result.steps for c in step.checks)]
    left_nothing = all(c.ok for c in checks if c.name in ("idle_at_end", "released"))
    if result.error:
        return DoorCall(clip, None, left_nothing=left_nothing, void=result.error, seconds=seconds, turns=turns)
    first, last = result.steps[0], result.steps[-1]
    if clip.category == "pause":
        return DoorCall(clip, bool(first.took_over), answer_ms=last.ttfb_ms, left_nothing=left_nothing,
                        seconds=seconds)
    if clip.category == "smooth":
        return DoorCall(clip, last.ttfb_ms is not None, answer_ms=last.ttfb_ms, left_nothing=left_nothing,
                        seconds=seconds, turns=turns)
    if not last.agent_speaking_at_onset:
        return DoorCall(clip, None, left_nothing=left_nothing, void=NOT_SPEAKING,
                        seconds=seconds)
    cut = last.cut_response is not None
    interruption = clip.category == "interruption"
    return DoorCall(clip, cut, stop_ms=last.stop_ms if cut and interruption else None,
                    answer_ms=last.ttfb_ms if interruption else None, left_nothing=left_nothing, seconds=seconds)


def verdict(call: DoorCall) -> str:
    if call.takeover is None:
        return f"void: {call.void}"
    said = "took over" if call.takeover else "held"
    if call.clip.category == "smooth":
        said = f"answered ({call.turns} turns)" if call.takeover else f"not answered ({call.turns} turns)"
    latency = f", {call.latency_ms:.0f} ms" if call.latency_ms is not None else ""
    return said + latency + ("" if call.left_nothing else ", LEFT STATE BEHIND")


def ways_of(clips: list[spec.Clip]) -> list[tuple[spec.Clip, str]]:
    """Each clip with how its call's turns end: a complete turn twice (the server's own way and
    silence, the order alternating so that neither always comes first), the others once."""
    played: list[tuple[spec.Clip, str]] = []
    pair = (DEFAULT_TURNS, SILENCE_TURNS)
    for clip in clips:
        if clip.category == "smooth":
            played += [(clip, turns) for turns in pair]
            pair = pair[::-1]
        else:
            played.append((clip, DEFAULT_TURNS))
    return played


async def play(url: str, clips: list[spec.Clip], cache: Path, voice: str = PIPER,
               progress: Callable[[str], None] = lambda _: None) -> list[DoorCall]:
    """Each clip as one call against the server at ``url`` (alone on it), one after another."""
    calls: list[DoorCall] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="duplex-door-") as tmp:
        try:
            played = ways_of(clips)
            for n, (clip, turns) in enumerate(played, 1):
                scenario = scenario_of(clip, render(cache, clip), Path(tmp) / str(n), voice, turns)
                started = time.monotonic()
                recording = await run_scenario(scenario, url, exclusive=True)
                call = judge(clip, measure(scenario, recording), time.monotonic() - started, turns)
                calls.append(call)
                elapsed = time.monotonic() - began
                progress(f"  call {n}/{len(played)} ({elapsed / 60:.1f} min, about "
                         f"{elapsed / n * (len(played) - n) / 60:.1f} min to go) {clip.key}: {verdict(call)}")
        except asyncio.CancelledError:  # SIGINT (asyncio.run cancels us): a long run reports the calls it made
            progress(f"  stopped: the {len(calls)} calls made are reported, the one in flight is not")
    return calls

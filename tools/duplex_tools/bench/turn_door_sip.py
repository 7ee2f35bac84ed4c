"""The corpus' overlaps end to end through the SIP door: each clip one phone call (``sip_caller``:
SIPp places it, this process is the phone's G.711 audio) against a real server's SIP edge.

The call is the WebRTC door's (``turn_door.py``): the caller asks the same question in the same
voice and, once 1 s of the answer was heard, the clip plays over it from its sound's start to its
end. A phone hears no events, so what the server made of the sound is read from its own counters
(``duplex_overlap_verdicts_total{door="sip"}``, the calls one at a time on a server that is ours
alone): a take-over is an interruption judged before the cut's window closed (as at the WebRTC
door, the clip's end + the end-of-turn silence + ``CUT_WINDOW_S``). The stop (an interruption's
onset -> the agent silent) is read from the agent's audio as it reached the phone.

A pause is the WebRTC door's too: the sentence in two parts cut where the caller goes on, queued
back to back (the pause inside the first). With no events, the phone's ear judges: a take-over is
the agent heard between the pause's start and ``REPLY_AFTER_S`` past the second part's onset (a
reply the server began before it heard the caller go on; no answer to the whole sentence can be
heard that soon); the answer's latency, of a pause held, is the sentence's end -> the agent heard.

A complete turn is the clip alone; its latency the clip's end -> the agent heard. A phone cannot
ask for silence-ended turns, so its baseline is played on a second server whose sessions end turns
on silence (``SILENCE_OVERRIDE``)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from duplex.config.session import VadConfig
from duplex_tools.bench.turn_door import (
    DEFAULT_TURNS,
    NOT_SPEAKING,
    QUESTION,
    RATE,
    DoorCall,
    resume_sample,
    verdict,
)
from duplex_tools.client import RATE as SPEECH_RATE
from duplex_tools.scenario.audio import step_audio
from duplex_tools.scenario.measure import STOP_WINDOW_S
from duplex_tools.scenario.model import PIPER, Scenario
from duplex_tools.scenario.runner import CUT_WINDOW_S
from duplex_tools.scenario.server_stats import ServerStats, StatsError
from duplex_tools.sip_caller import FRAME_S, PhoneAudio, SippCall
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.render import Rendered, render

SILENCE_OVERRIDE = ["--session.turn_detection", "server_vad"]  # `duplex serve` flags: silence-ended turns
ANSWER_WAIT_S = 30.0  # the longest wait for 1 s of the answer (a busy box answers in seconds)
FIRST_PACKET_S = 15.0  # the call answered and the agent's audio (silence at first) flowing
REPLY_AFTER_S = 0.3  # the agent's next reply is never heard sooner than this after the caller's end


def sip_edge_of(server_output: list[str]) -> tuple[str, int] | None:
    """Where a started ``duplex serve --sip`` says its SIP edge listens."""
    found = re.search(r"SIP on udp ([\d.]+):(\d+)", "".join(server_output))
    return (found.group(1), int(found.group(2))) if found else None


async def verdicts(url: str) -> dict[str, float]:
    """The server's overlap verdicts at the SIP door so far, by kind."""
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"{url}/metrics")
    reply.raise_for_status()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.text):
        if family.name == "duplex_overlap_verdicts":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("door") == "sip":
                    counts[sample.labels["kind"]] = sample.value
    return counts


async def _until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(FRAME_S)
    return True


async def _nothing_left(url: str, timeout: float = 10.0) -> bool:
    """No SIP call, session or stage state left once the call ended."""
    stats = ServerStats(url)
    try:
        await stats.wait_idle(timeout, no_sessions=True)
        return True
    except StatsError:
        return False
    finally:
        await stats.close()


def question_audio(voice: str) -> np.ndarray:
    asking = Scenario.model_validate({"name": "question", "steps": [{"say": QUESTION, "voice": voice}]})
    return step_audio(asking, asking.steps[0])


@dataclass(frozen=True)
class _Judged:
    """What one call said: a take-over or not and its latencies, or why it says nothing."""

    takeover: bool | None = None
    stop_ms: float | None = None
    answer_ms: float | None = None
    void: str | None = None


async def _overlap(phone: PhoneAudio, clip: spec.Clip, rendered: Rendered, question: np.ndarray,
                   url: str, before: dict[str, float]) -> _Judged:
    """Ask, wait for 1 s of the answer, play the clip over it, wait out the cut's window; a
    take-over is an interruption counted by then (``before``: the counts before the call)."""
    asked, length = phone.say(question, SPEECH_RATE)
    question_end = await asked + length
    if not await _until(lambda: phone.loud_since(question_end) >= 1.0, length + ANSWER_WAIT_S):
        return _Judged(void=f"no second of an answer within {ANSWER_WAIT_S:.0f} s")
    now = time.monotonic()
    if phone.last_loud(now - 5 * FRAME_S, now + 1) is None:
        return _Judged(void=NOT_SPEAKING)
    played, clip_s = phone.say(rendered.audio[rendered.start:rendered.end] / 32768.0, RATE)
    onset = await played
    window_end = onset + clip_s + VadConfig().silence_ms / 1000 + CUT_WINDOW_S
    await asyncio.sleep(max(0.0, window_end - time.monotonic()))  # the cut's window, as the WebRTC door's
    after = await verdicts(url)
    cut = after.get("interruption", 0.0) > before.get("interruption", 0.0)
    if not (cut and clip.category == "interruption"):
        return _Judged(cut)
    last = phone.last_loud(onset, min(onset + STOP_WINDOW_S, onset + clip_s + REPLY_AFTER_S))
    return _Judged(cut, stop_ms=round(1000 * (last + FRAME_S - onset), 1) if last is not None else 0.0)


async def _pause(phone: PhoneAudio, rendered: Rendered) -> _Judged:
    """Say the sentence with its pause; a take-over is the agent heard before the caller went on,
    the answer's latency (of a pause held) the sentence's end -> the agent heard."""
    audio = rendered.audio / 32768.0
    resume = resume_sample(rendered)
    assert rendered.pause_at is not None  # resume_sample checked it
    said, _ = phone.say(audio[rendered.start:resume], RATE)
    went_on, rest_s = phone.say(audio[resume:rendered.end], RATE)
    pause_at = await said + (rendered.pause_at - rendered.start) / RATE
    resumed = await went_on
    window_end, end = resumed + REPLY_AFTER_S, resumed + rest_s
    await _until(lambda: phone.first_loud(window_end) is not None, rest_s + ANSWER_WAIT_S)
    if phone.first_loud(pause_at, window_end) is not None:
        return _Judged(True)
    answer = phone.first_loud(window_end)
    return _Judged(False, answer_ms=round(1000 * (answer - end), 1) if answer is not None else None)


async def _complete(phone: PhoneAudio, rendered: Rendered) -> _Judged:
    """Say the turn; answered if the agent is heard after its end, the latency the end -> the agent heard."""
    said, length = phone.say(rendered.audio[rendered.start:rendered.end] / 32768.0, RATE)
    end = await said + length
    await _until(lambda: phone.first_loud(end) is not None, length + ANSWER_WAIT_S)
    answer = phone.first_loud(end)
    return _Judged(answer is not None, answer_ms=round(1000 * (answer - end), 1) if answer is not None else None)


async def call(server: tuple[str, int], url: str, clip: spec.Clip, rendered: Rendered,
               question: np.ndarray, turns: str = DEFAULT_TURNS) -> DoorCall:
    """One clip as one phone call, judged."""
    began = time.monotonic()
    before = await verdicts(url)
    phone = PhoneAudio()
    audio_task = asyncio.create_task(phone.run())
    sipp = SippCall(server, phone.port)
    await sipp.start()
    try:
        if not await _until(lambda: phone.agent is not None, FIRST_PACKET_S):
            judged = _Judged(void="the agent's audio never came")
        elif clip.category == "pause":
            judged = await _pause(phone, rendered)
        elif clip.category == "smooth":
            judged = await _complete(phone, rendered)
        else:
            judged = await _overlap(phone, clip, rendered, question, url, before)
    finally:
        sipp.hang_up()
        failed = await sipp.ended(timeout=15)
        audio_task.cancel()
        await asyncio.gather(audio_task, return_exceptions=True)
        phone.close()
    left_nothing = await _nothing_left(url)
    seconds = time.monotonic() - began
    if failed is not None or judged.void is not None:
        return DoorCall(clip, None, left_nothing=left_nothing, void=failed or judged.void, seconds=seconds,
                        turns=turns)
    return DoorCall(clip, judged.takeover, stop_ms=judged.stop_ms, answer_ms=judged.answer_ms,
                    left_nothing=left_nothing, seconds=seconds, turns=turns)


async def play(server: tuple[str, int], url: str, clips: list[spec.Clip], cache: Path, voice: str = PIPER,
               progress: Callable[[str], None] = lambda _: None, turns: str = DEFAULT_TURNS) -> list[DoorCall]:
    """Each clip as one phone call to the SIP edge at ``server`` (its HTTP at ``url``), one after
    another; ``turns``: how that server's sessions end turns (``turn_door.TURNS``)."""
    question = question_audio(voice)
    calls: list[DoorCall] = []
    began = time.monotonic()
    try:
        for n, clip in enumerate(clips, 1):
            judged = await call(server, url, clip, render(cache, clip), question, turns)
            calls.append(judged)
            elapsed = time.monotonic() - began
            progress(f"  call {n}/{len(clips)} ({elapsed / 60:.1f} min, about "
                     f"{elapsed / n * (len(clips) - n) / 60:.1f} min to go) {clip.key}: {verdict(judged)}")
    except asyncio.CancelledError:  # SIGINT: a long run reports the calls it made
        progress(f"  stopped: the {len(calls)} calls made are reported, the one in flight is not")
    return calls

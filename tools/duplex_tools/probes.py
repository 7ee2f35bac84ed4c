"""Scripted moves of a Realtime client and what they measure: ask a question, barge in."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from duplex_tools.client import RealtimeClient

FRAME_S = 0.02


@dataclass(frozen=True)
class BargeIn:
    stop_ms: float  # the caller's speech onset (sent) -> last agent audio heard has ended
    server_ms: float | None  # the server's own onset -> flush measurement
    audio_end_ms: int  # where the server says the response was truncated
    heard_before_ms: float  # agent audio the client heard of that response before the onset
    response_id: str
    status: str  # response.done status of the interrupted response


class TooShort(TimeoutError):
    """The reply ended (or stalled) before as much of it was heard as asked."""


async def ask(client: RealtimeClient, question: np.ndarray, timeout: float = 20.0) -> dict:
    """Say ``question``; return the ``response.created`` event of the reply to it."""
    start = time.monotonic()
    client.mic.play(question)
    await client.wait_event("input_audio_buffer.speech_stopped", timeout=timeout, after=start)
    return await client.wait_event("response.created", timeout=timeout, after=start)


async def hear(client: RealtimeClient, since: float, seconds: float, timeout: float = 10.0) -> None:
    """Wait until ``seconds`` of loud agent audio arrived after ``since``."""
    deadline = time.monotonic() + timeout
    while len(client.loud_frames(since)) * FRAME_S < seconds:
        if time.monotonic() > deadline:
            raise TooShort(f"less than {seconds} s of agent audio within {timeout} s")
        await asyncio.sleep(FRAME_S)


async def barge_in(client: RealtimeClient, response_id: str, interruption: np.ndarray,
                   after_heard_s: float = 0.6, quiet_window_s: float = 0.8) -> BargeIn:
    """Interrupt response ``response_id`` once ``after_heard_s`` of it was heard.

    The stop time is taken on the client: from the moment its microphone sent the first loud
    frame of ``interruption`` to the end of the last loud agent frame that arrived within
    ``quiet_window_s`` (shorter than the interruption plus the end-of-turn silence, so the reply
    to the interruption cannot be mistaken for the old one)."""
    started = await client.wait_event("output_audio_buffer.started", timeout=20, response_id=response_id)
    await hear(client, client.time_of(started), after_heard_s)
    clip = client.mic.play(interruption)
    truncated = await client.wait_event("conversation.item.truncated", timeout=5, after=client.time_of(started))
    onset = clip.onset_sent
    if onset is None:
        raise RuntimeError("the interruption had no loud frame")
    if not client.loud_frames(onset - 0.2, onset):
        raise RuntimeError("the agent was not speaking when the barge-in began")
    await asyncio.sleep(max(0.0, onset + quiet_window_s - time.monotonic()))
    loud = client.loud_frames(onset, onset + quiet_window_s)
    stop_ms = 1000 * (max(h.at for h in loud) + FRAME_S - onset) if loud else 0.0
    done = next(e for e in client.of_type("response.done") if e["response"]["id"] == response_id)
    server_ms = next((e["barge_in_ms"] for e in client.of_type("duplex.metrics")
                      if e["response_id"] == response_id and e.get("barge_in_ms") is not None), None)
    return BargeIn(stop_ms=stop_ms, server_ms=server_ms, audio_end_ms=truncated["audio_end_ms"],
                   heard_before_ms=1000 * (onset - client.time_of(started)), response_id=response_id,
                   status=done["response"]["status"])


async def next_response(client: RealtimeClient, after: float, timeout: float = 20.0) -> dict:
    """The ``response.created`` of the next reply begun after monotonic time ``after``."""
    return await client.wait_event("response.created", timeout=timeout, after=after)

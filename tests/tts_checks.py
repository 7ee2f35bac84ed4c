"""Checks every TTS stage that calls a server must pass, whatever its protocol: an abort (a
barge-in) closes its stream at once, and `duplex serve` with the stage answers a spoken order
with the server's audio and leaves no stream open. Each stage's test module calls them with its
own builder and server."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from duplex.config.pipeline import StageConfig
from duplex.runtime.contract import AgentAudio, AgentText, TurnRequest, WorkItem
from duplex.runtime.schedulers.stream import StreamScheduler
from duplex_tools.harness import ServerProcess, server_stats
from duplex_tools.ws_client import RATE, WsCaller
from tests.local_helpers import ORDER, speak, wait_until, word_recall

LONG_REPLY = " ".join(["Sure, we have classic milk tea, taro, matcha, brown sugar and mango."] * 8)
ABORT_CLOSES_WITHIN_S = 1.0  # a hang guard: closing is a socket close, not model work


async def abort_closes_the_stream(builder: str, stage, open_at_first_audio: bool = False) -> None:
    """A long reply through the stage's scheduler; once its first audio is out, an abort ends the
    request and leaves no stream open. ``open_at_first_audio``: the stage keeps one stream for
    the whole reply, so one is open when the first audio comes."""
    scheduler = StreamScheduler(StageConfig(name="tts", builder=builder, scheduler="stream"), stage)
    scheduler.start()
    try:
        request = TurnRequest(session_id="abort")
        scheduler.inbox.put(WorkItem("ra", "thinker", AgentText(LONG_REPLY), True, request))
        deadline = time.monotonic() + 60
        while not any(isinstance(e.data, AgentAudio) for e in scheduler.outbox.drain()):
            assert time.monotonic() < deadline, f"no audio from the {builder} server"
            await asyncio.sleep(0.01)
        if open_at_first_audio:
            assert scheduler.resources()["open_streams"] == 1
        aborted = time.monotonic()
        scheduler.abort("ra")
        wait_until(lambda: not scheduler.live_requests() and scheduler.resources()["open_streams"] == 0,
                   timeout=5, what="the request ended and its stream closed")
        assert time.monotonic() - aborted < ABORT_CLOSES_WITHIN_S
    finally:
        scheduler.stop()


async def serve_answers_an_order(args: list[str]) -> None:
    """`duplex serve ARGS` (Whisper in process): a spoken order is heard, answered to the end
    with more than half a second of audio, and no TTS stream is left open."""
    order = np.concatenate([speak(ORDER, rate=RATE), np.zeros(RATE, np.float32)])
    with ServerProcess([*args, "--port", "0", "--max-sessions", "1"], ready_timeout=300) as proc:
        async with WsCaller(proc.url) as caller:
            caller.say(order)
            heard = await caller.wait("conversation.item.input_audio_transcription.completed", timeout=60)
            assert word_recall(ORDER, heard.transcript) >= 0.8, heard.transcript
            response = (await caller.wait("response.created", timeout=60)).response
            done = await caller.wait("response.done", timeout=60, after=caller.time_of(heard))
            assert done.response.status == "completed", done
            assert len(caller.audio_of(response.id)) > RATE // 2, "less than half a second of reply audio"
        stats = await asyncio.to_thread(server_stats, proc.url)
        assert stats["stages"]["tts"]["resources"]["open_streams"] == 0
    assert proc.stop() == 0, "".join(proc.output[-30:])

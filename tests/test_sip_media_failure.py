"""A phone call whose conversation fails on its audio ends (the SIP leg is told and hangs up with
BYE) instead of sitting deaf and mute until the caller gives up: the call's media clock stops
and reports the failure once. Real UDP socket on loopback; the agent raises as a broken
session would."""

from __future__ import annotations

import asyncio

import numpy as np

from duplex.edge.sip.media import CallMedia
from duplex.edge.sip.sdp import Negotiated


class BrokenAgent:
    input_rate = 16000
    output_rate = 8000

    def __init__(self, fail_after: int) -> None:
        self.heard = 0
        self.fail_after = fail_after

    def caller_audio(self, pcm: np.ndarray, arrival: float) -> None:
        self.heard += 1
        if self.heard > self.fail_after:
            raise RuntimeError("the session broke")

    def agent_audio(self, due: float) -> np.ndarray:
        return np.zeros(160, np.int16)

    def dtmf(self, digit: str) -> None:
        pass

    def set_barge_in_listener(self, listener) -> None:
        pass


async def test_a_conversation_that_fails_on_the_audio_ends_the_call_once():
    media = await CallMedia.open("127.0.0.1", 42000, 42100)
    failed: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
    media.on_failure = failed.set_result  # a second report would raise InvalidStateError
    agent = BrokenAgent(fail_after=3)
    media.start(agent, Negotiated("PCMU", 0, None, "127.0.0.1", 9, "sendrecv"))
    try:
        exc = await asyncio.wait_for(failed, timeout=5.0)
        assert str(exc) == "the session broke" and agent.heard == 4
        assert not media.running  # the clock returned right after reporting it
    finally:
        await media.close()

"""Answering-machine screening of calls placed through the API (`duplex serve`, toy-voice), to a
callee of the test's own that plays a recorded answer over RTP in real time: a machine's
greeting (espeak-ng) and its beep, or a person's short "hello?". The verdicts come back as the
placed call's events; a machine with ``hang_up`` gets our BYE, with ``leave_message`` the agent's
message after the beep and then our BYE; a person hears the first message and the call goes on."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import numpy as np
import pytest

from duplex.edge.media import g711
from duplex_tools.harness import ServerProcess, espeak, wait_stats
from tests.sip_callee import Callee

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
DECIDE_S = 3.0  # the detector decides within 3 s of audio
SLACK_S = 1.0  # the callee's pacing and the server's frame loop, well over a few 20 ms frames
GREETING = ("Hi, you have reached the voicemail of Alex Morgan. I am not able to take your call right now. "
            "Please leave your name and number after the tone.")


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "2",
                        "--sip", "127.0.0.1:0", "--sip-rtp-ports", "47000-47999",
                        "--sip-outbound-allow", "sip:*@127.0.0.1:*"]) as proc:
        assert re.search(r"SIP on udp", "".join(proc.output)), "".join(proc.output)
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def _pcm(text: str) -> np.ndarray:
    return g711.float_to_int16(espeak(text, rate=8000))


def _beep(seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(8000 * seconds)) / 8000
    return (12000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(8000 * seconds), np.int16)


async def _place(http: httpx.AsyncClient, callee: Callee, policy: str) -> str:
    reply = await http.post("/v1/calls/outbound", json={
        "to": callee.uri, "first_message": "Hello, this is the clinic calling about your appointment.",
        "answering_machine": policy})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


async def _events(http: httpx.AsyncClient, call_id: str) -> list[dict]:
    return (await http.get(f"/v1/calls/outbound/{call_id}")).json()["events"]


async def _state_is(http: httpx.AsyncClient, call_id: str, state: str) -> bool:
    return (await http.get(f"/v1/calls/outbound/{call_id}")).json()["state"] == state


def _at(events: list[dict], kind: str) -> float:
    return next(e["at_s"] for e in events if e["type"] == kind)


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _nothing_left(current: dict) -> bool:
    sip = current["edges"]["sip"]
    return (sip["calls"] == 0 and sip["rtp_sockets"] == 0 and sip["agents"] == 0
            and sip["outbound"]["live"] == 0 and current["sessions"]["live"] == 0)


async def _run(server, policy: str, answer: np.ndarray, body) -> None:
    callee = Callee()
    listener = asyncio.get_running_loop().create_task(callee.listen())
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            call_id = await _place(http, callee, policy)
            addr = await callee.answer()
            await body(http, call_id, callee, addr, answer)
        await wait_stats(server.url, _nothing_left, 10)
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        callee.close()


async def test_machine_hung_up_on(server):
    async def body(http, call_id, callee, addr, answer):
        playing = asyncio.get_running_loop().create_task(callee.play(answer))
        bye, _ = await callee.next_request("BYE", timeout=DECIDE_S + SLACK_S + 5)
        callee.respond(bye, addr, 200, "OK")
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        await _until(lambda: _state_is(http, call_id, "ended"), 10, "ended")
        events = await _events(http, call_id)
        assert [e["type"] for e in events] == ["calling", "ringing", "answered", "answered_by_machine", "ended"]
        assert _at(events, "answered_by_machine") - _at(events, "answered") <= DECIDE_S + SLACK_S
        assert callee.first_loud() is None  # the agent said nothing to the machine
    await _run(server, "hang_up", np.concatenate([_pcm(GREETING), _beep(), _silence(3)]), body)


async def test_message_left_after_the_beep(server):
    greeting = _pcm(GREETING)

    async def body(http, call_id, callee, addr, answer):
        playing = asyncio.get_running_loop().create_task(callee.play(answer))
        beep_sent_by = time.monotonic() + (len(greeting) + len(_beep())) / 8000  # when the beep's end leaves
        bye, _ = await callee.next_request("BYE", timeout=len(answer) / 8000 + 20)
        callee.respond(bye, addr, 200, "OK")
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        spoke = callee.first_loud()
        assert spoke is not None, "no message was left"
        assert spoke >= beep_sent_by - 0.02  # not before the beep was over (a frame's rounding)
        await _until(lambda: _state_is(http, call_id, "ended"), 10, "ended")  # the call is torn down after its BYE
        events = await _events(http, call_id)
        kinds = [e["type"] for e in events]
        assert kinds[:5] == ["calling", "ringing", "answered", "answered_by_machine", "leaving_message"]
        assert kinds[-1] == "ended" and "message left" in events[-1]["detail"]
    await _run(server, "leave_message", np.concatenate([greeting, _beep(), _silence(15)]), body)


async def test_person_hears_the_first_message(server):
    async def body(http, call_id, callee, addr, answer):
        answered_at = time.monotonic()
        await callee.play(answer)
        await _until_async(lambda: callee.first_loud() is not None, 10, "the first message")
        # a person: the greeting, ~0.7 s of silence to decide, then the message
        assert callee.first_loud() - answered_at <= DECIDE_S + SLACK_S
        events = await _events(http, call_id)
        assert [e["type"] for e in events][-1] == "answered_by_human"
        callee.hang_up(addr)
        assert (await callee.next_response("BYE")).status == 200
    await _run(server, "hang_up", np.concatenate([_pcm("Hello?"), _silence(2.5)]), body)


async def _until_async(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)

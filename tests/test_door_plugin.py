"""A door of one's own is one module plus ``--door MODULE:FACTORY``: a real ``duplex serve --config
toy-voice --door tests.doors.raw_pcm:make_door`` (raw PCM over a WebSocket at /pcm, written in the
tests folder against ``duplex/edge/plugin``) answers a spoken question, clears and silences the
agent when the caller barges in, sits behind the server's API key like the built-in doors, and
shows its own stats in /duplex/stats with nothing left once the socket is gone. A bad ``--door``
stops ``duplex serve`` before anything starts, saying what was wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from duplex.audio import SESSION_RATE
from duplex.cli import main
from duplex.edge.plugin import DoorContext, DoorError, build_doors
from duplex.session.pacing import FramePacer
from duplex_tools.harness import ServerProcess, espeak, server_stats, wait_stats
from tests.doors.raw_pcm import PATH, TRANSPORT, RawPcmDoor

LOUD = 1000  # int16 RMS of a frame that counts as speech
FRAME = SESSION_RATE // 50  # 20 ms of caller audio
KEY = "door-plugin-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "2", "--api-key", KEY,
                        "--door", "tests.doors.raw_pcm:make_door"]) as proc:
        proc.ws = proc.url.replace("http://", "ws://") + PATH
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def _door_idle(current: dict) -> bool:
    door = current["edges"].get(TRANSPORT, {})
    return door.get("live_connections") == 0 and current["sessions"]["live"] == 0


@dataclass
class Received:
    pcm: np.ndarray | None  # an agent frame, or None for the clear
    sent: int  # caller samples sent when it arrived (the caller's own clock)

    @property
    def loud(self) -> bool:
        return self.pcm is not None and float(np.sqrt(np.mean(self.pcm.astype(np.float64) ** 2))) > LOUD


def _seconds(items: list[Received], loud_only: bool = False) -> float:
    """Agent audio in these items, from the frames' sizes."""
    return sum(len(r.pcm) for r in items if r.pcm is not None and (r.loud or not loud_only)) / SESSION_RATE


class PcmCaller:
    """The client of the raw PCM door: sends int16 16 kHz in real time, records what comes back."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.received: list[Received] = []
        self.sent = 0
        self.pacer = FramePacer(FRAME / SESSION_RATE)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if isinstance(message, bytes):
                self.received.append(Received(np.frombuffer(message, np.int16), self.sent))
            else:
                assert json.loads(message) == {"type": "clear"}, message
                self.received.append(Received(None, self.sent))

    async def stream(self, pcm: np.ndarray) -> None:
        for start in range(0, len(pcm), FRAME):
            await self.pacer.wait_next()
            await self.ws.send(pcm[start:start + FRAME].tobytes())
            self.sent += len(pcm[start:start + FRAME])

    async def listen_until(self, done: Callable[[], bool], max_s: float) -> bool:
        """Send silence (a caller's line keeps going) until ``done``, for at most ``max_s``."""
        silence = np.zeros(FRAME, np.int16)
        for _ in range(int(max_s * SESSION_RATE / FRAME)):
            if done():
                return True
            await self.stream(silence)
        return done()

    def clears(self) -> list[int]:
        return [i for i, r in enumerate(self.received) if r.pcm is None]

    def after_clear(self) -> list[Received]:
        clears = self.clears()
        return self.received[clears[0] + 1:] if clears else []

    async def hang_up(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


def _speech(text: str) -> np.ndarray:
    return np.clip(espeak(text, rate=SESSION_RATE) * 32767, -32768, 32767).astype(np.int16)


async def _caller(server) -> PcmCaller:
    return PcmCaller(await connect(server.ws, additional_headers=AUTH, max_size=2**20))


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_plugin_door_answers_a_spoken_question(server):
    question = _speech("Hello, could you tell me what time it is")
    caller = await _caller(server)
    try:
        await caller.stream(question)
        asked = len(caller.received)
        answered = await caller.listen_until(lambda: _seconds(caller.received[asked:], loud_only=True) >= 1.0,
                                             max_s=10)
        heard = _seconds(caller.received[asked:], loud_only=True)
        assert answered, f"only {heard:.2f} s of loud agent audio came back"
        assert not any(r.loud for r in caller.received[:asked]), "the agent spoke over the question"
        assert not caller.clears(), "nobody interrupted, yet the door was told to clear"
        assert caller.pacer.reanchors == 0, "the test caller could not keep time; the run proves nothing"
    finally:
        await caller.hang_up()
    current = await wait_stats(server.url, _door_idle, headers=AUTH)
    door = current["edges"][TRANSPORT]
    assert door["connected"] >= 1 and door["frames_sent"] > 0, door


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_an_interruption_clears_and_silences_the_agent(server):
    question = _speech("Hello, could you tell me what time it is")
    # long enough that the agent should stay quiet for a good while after the clear (it may
    # answer the interruption only once the caller has finished it)
    interruption = _speech("Wait, wait, stop please, I want to ask you something else")
    caller = await _caller(server)
    try:
        await caller.stream(question)
        asked = len(caller.received)
        talking = await caller.listen_until(lambda: _seconds(caller.received[asked:], loud_only=True) >= 0.5,
                                            max_s=10)
        assert talking, "the agent never talked"
        onset = len(caller.received)
        assert sum(r.loud for r in caller.received[onset - 10:onset]) >= 5, \
            "the agent was not talking when the caller interrupted"
        await caller.stream(interruption)
        ended = caller.sent  # the caller's sample count at the interruption's end
        # once cleared, take at least 0.5 s of frames after the clear (by their sizes), whatever
        # came during the interruption
        settled = await caller.listen_until(lambda: _seconds(caller.after_clear()) >= 0.5, max_s=5)
        assert caller.clears(), "no clear was sent on the barge-in"
        assert settled
        clear = caller.clears()[0]
        assert clear >= onset, "the clear came before the interruption"
        while_interrupting = [r for r in caller.after_clear() if r.sent <= ended]
        window = _seconds(while_interrupting)
        cleared_after_s = (caller.received[clear].sent - (ended - len(interruption))) / SESSION_RATE
        print(f"raw PCM door: interruption onset -> clear: {cleared_after_s * 1000:.0f} ms of the caller's audio; "
              f"{window:.2f} s of agent audio after it while the caller went on")
        assert window >= 0.5, f"the clear came too late to check the silence after it ({window:.2f} s)"
        assert not any(r.loud for r in while_interrupting), "agent audio kept coming after the clear"
    finally:
        await caller.hang_up()
    current = await wait_stats(server.url, _door_idle, headers=AUTH)
    assert current["edges"][TRANSPORT]["clears_sent"] >= 1


@pytest.mark.slow
async def test_the_plugin_door_sits_behind_the_api_key(server):
    with pytest.raises(InvalidStatus) as refused:
        await connect(server.ws)
    assert refused.value.response.status_code == 401
    assert _door_idle(await asyncio.to_thread(server_stats, server.url, AUTH))


@pytest.mark.parametrize(("spec", "said"), [
    ("tests.doors.raw_pcm", "expected MODULE:FACTORY"),
    ("no_such_door_module:make_door", "no module named 'no_such_door_module'"),
    ("tests.doors.raw_pcm:no_such_factory", "has no attribute 'no_such_factory'"),
    ("tests.doors.raw_pcm:PATH", "'PATH' is a str, not a factory"),
])
def test_a_bad_door_spec_stops_serve_before_it_starts(spec, said, capsys):
    assert main(["serve", "--config", "toy-voice", "--port", "0", "--door", spec]) == 2
    out, err = capsys.readouterr()
    assert said in err and spec in err, err
    assert "starting" not in out  # no stage process was started


def test_door_names_are_unique_and_leave_the_servers_own_alone():
    context = DoorContext(sessions=None, max_call_s=60.0, call_rate=None, limit_loopback=False)  # type: ignore[arg-type]

    def named(name: str) -> Callable[[DoorContext], RawPcmDoor]:
        def factory(context: DoorContext) -> RawPcmDoor:
            door = RawPcmDoor(context.sessions)
            door.name = name
            return door
        return factory

    assert [d.name for d in build_doors([named("a"), named("b")], context)] == ["a", "b"]
    with pytest.raises(DoorError, match="'a' is taken"):
        build_doors([named("a"), named("a")], context)
    with pytest.raises(DoorError, match="'websocket' is taken"):
        build_doors([named("websocket")], context)

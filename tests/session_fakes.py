"""A VoiceSession in process: a scripted runtime, a fake clock, speech made at test time.

``FakeRuntime`` implements the session's port (``duplex.session.port``): every request the
session starts becomes a ``FakeTurn`` that records what was fed and replies only what the test
scripts (agent text and audio, a transcript, a failure, an end). ``Call`` drives a session one
20 ms frame at a time, output frame then input frame, on a clock that only the test advances;
whatever the session emits is kept. Nothing waits on wall time: ``Call.settle`` returns once
the session has taken every scripted reply (its consumer task handles a reply in the same loop
step it takes it in).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from duplex.config.session import SessionConfig
from duplex.models.toy_voice.synth import speak
from duplex.runtime.contract import (
    SESSION_RATE,
    AgentAudio,
    AgentText,
    CallerAudio,
    ErrorCode,
    Request,
    StageError,
    Transcript,
)
from duplex.session.call_control import CallControl, NoCallControl
from duplex.session.door import AudioClear, SimpleDoor
from duplex.session.endpoint import TurnEndModel
from duplex.session.playout import OutputFormat
from duplex.session.port import TurnEnded, TurnEvent, TurnStatus
from duplex.session.realtime import events as ev
from duplex.session.session import VoiceSession

FRAME_MS = 20
FRAME = SESSION_RATE * FRAME_MS // 1000
OUTPUT = OutputFormat(sample_rate=SESSION_RATE, channels=1, frame_ms=FRAME_MS)  # no resampling: exact ms
ARRIVAL_LAG_S = 0.003  # caller audio reaches the session a little after the output frame left
SETTLE_TIMEOUT_S = 5.0  # only a guard against a broken session: settling takes one loop step


CLOCK_START = 100.0  # the fake clock's reading when a call begins


class FakeClock:
    def __init__(self, start: float = CLOCK_START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Break:
    def __init__(self, message: str) -> None:
        self.message = message


class FakeTurn:
    """One request: what the session fed it, and a queue of the replies the test scripts."""

    def __init__(self, request: Request, request_id: str) -> None:
        self.request = request
        self.request_id = request_id
        self.fed: list[CallerAudio] = []
        self.eos = False
        self.aborted = False
        self.ended = False
        self.read_to_end = False
        self._replies: asyncio.Queue[TurnEvent | _Break] = asyncio.Queue()

    # -- the port ------------------------------------------------------------------------------
    def feed(self, audio: CallerAudio, eos: bool = False) -> None:
        assert not self.eos, f"{self.request_id}: audio fed after its end of input"
        self.fed.append(audio)
        self.eos = eos

    def abort(self) -> None:
        self.aborted = True
        if not self.ended:  # as the runtime does: an aborted request's stream ends "aborted"
            self._put(TurnEnded(TurnStatus.ABORTED, StageError(ErrorCode.ABORTED, "aborted")))

    async def events(self) -> AsyncIterator[TurnEvent]:
        try:
            while True:
                event = await self._replies.get()
                self._replies.task_done()  # handled before the test runs again (same loop step)
                if isinstance(event, _Break):
                    raise ConnectionError(event.message)
                yield event
                if isinstance(event, TurnEnded):
                    return
        finally:
            self.read_to_end = True  # or the session stopped reading (hang-up)

    # -- what the test scripts -----------------------------------------------------------------
    def say(self, *words: str) -> float:
        """Per word its text delta and its audio (toy voice); returns the seconds of audio."""
        seconds = 0.0
        for index, word in enumerate(words):
            audio = speak(word, index)
            self._put(AgentText(word if index == 0 else " " + word))
            self._put(AgentAudio(audio, SESSION_RATE, word))
            seconds += len(audio) / SESSION_RATE
        return seconds

    def transcript(self, text: str, final: bool = True) -> None:
        self._put(Transcript(text, final))

    def complete(self) -> None:
        self._put(TurnEnded(TurnStatus.COMPLETED))

    def fail(self, message: str) -> None:
        self._put(TurnEnded(TurnStatus.FAILED, StageError(ErrorCode.STAGE_FAILED, message, stage="mind")))

    def break_stream(self, message: str) -> None:
        """The stream itself raises (a runtime that lost its connection)."""
        self._put(_Break(message))
        self.ended = True

    def _put(self, event: TurnEvent | _Break) -> None:
        assert not self.ended, f"{self.request_id}: scripted after its end"
        self.ended = isinstance(event, TurnEnded)
        self._replies.put_nowait(event)

    async def taken(self) -> None:
        if not self.read_to_end:
            await self._replies.join()

    # -- what the session fed ------------------------------------------------------------------
    @property
    def fed_samples(self) -> int:
        return sum(len(audio.samples) for audio in self.fed)

    @property
    def fed_ms(self) -> int:
        return 1000 * self.fed_samples // SESSION_RATE

    @property
    def voiced(self) -> list[bool]:
        return [flag for audio in self.fed for flag in audio.voiced]


class FakeRuntime:
    def __init__(self) -> None:
        self.turns: list[FakeTurn] = []

    def start(self, request: Request) -> FakeTurn:
        turn = FakeTurn(request, f"req_{len(self.turns) + 1}")
        self.turns.append(turn)
        return turn

    async def stats(self) -> dict[str, dict]:
        return {}

    @property
    def last(self) -> FakeTurn:
        return self.turns[-1]


# -- caller audio, made at test time ---------------------------------------------------------------
def silence(ms: int) -> np.ndarray:
    return np.zeros(SESSION_RATE * ms // 1000, np.float32)


def words(text: str, gap_ms: int = 60) -> np.ndarray:
    """Speech-like audio (voiced syllables, toy voice) with a short gap after each word: well
    under any pause the session acts on, so the VAD hears one stretch of speech."""
    return np.concatenate([np.concatenate([speak(w, i), silence(gap_ms)]) for i, w in enumerate(text.split())])


def frames_of(audio: np.ndarray) -> list[np.ndarray]:
    """Whole 20 ms frames of int16 (a partial last frame is padded with silence)."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, np.int16)])
    return [pcm[i:i + FRAME] for i in range(0, len(pcm), FRAME)]


class Call:
    """A session and its caller, one frame at a time: each step the transport pulls the frame
    due now, then the caller's frame for the same 20 ms arrives."""

    def __init__(self, config: SessionConfig | None = None, echo_gain: float = 0.0, echo_delay_ms: int = 0,
                 turn_end: TurnEndModel | None = None, control: CallControl | None = None) -> None:
        self.clock = FakeClock()
        self.runtime = FakeRuntime()
        self.events: list[ev.ServerEvent] = []
        self._event_frames: list[int] = []  # per event: how many output frames had been pulled
        self.clears: list[AudioClear] = []  # the door's typed clear-audio signals, in order
        door = SimpleDoor("fake", OUTPUT, self._record, self.clears.append, control or NoCallControl("fake"))
        self.session = VoiceSession("sess_fake01", self.runtime, config or SessionConfig(), door,
                                    clock=self.clock, turn_end=turn_end)
        self.played: list[np.ndarray] = []  # every output frame, int16
        self.stream_ms = 0  # caller audio sent so far
        self._echo_gain = echo_gain
        self._echo_delay = SESSION_RATE * echo_delay_ms // 1000

    async def say(self, audio: np.ndarray) -> None:
        for frame in frames_of(audio):
            await self.step(frame)

    async def quiet(self, ms: int) -> None:
        await self.say(silence(ms))

    async def step(self, frame: np.ndarray) -> None:
        await self.settle()
        due = self.clock.now
        self.played.append(self.session.pull_output(due))
        self.clock.advance(FRAME_MS / 1000)
        self.session.push_input(self._with_echo(frame), arrival=self.clock.now + ARRIVAL_LAG_S)
        self.stream_ms += FRAME_MS

    async def settle(self) -> None:
        """Until the session has taken every reply scripted so far."""
        for turn in self.runtime.turns:
            await asyncio.wait_for(turn.taken(), SETTLE_TIMEOUT_S)

    def _with_echo(self, frame: np.ndarray) -> np.ndarray:
        if self._echo_gain == 0:
            return frame
        played = np.concatenate(self.played).astype(np.float32)
        end = len(played) - self._echo_delay
        echo = np.zeros(FRAME, np.float32)
        if end > 0:
            part = played[max(0, end - FRAME):end]
            echo[FRAME - len(part):] = part
        mixed = frame.astype(np.float32) + self._echo_gain * echo
        return np.clip(mixed, -32768, 32767).astype(np.int16)

    # -- what the client saw -------------------------------------------------------------------
    def _record(self, event: ev.ServerEvent) -> None:
        self.events.append(event)
        self._event_frames.append(len(self.played))

    def frame_of(self, event: ev.ServerEvent) -> int:
        """The index of the first output frame pulled after ``event`` was sent."""
        return self._event_frames[next(i for i, e in enumerate(self.events) if e is event)]

    def of_type(self, kind: type[ev.ServerEvent]) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def types(self) -> list[str]:
        return [type(e).__struct_config__.tag for e in self.events]

    def states(self) -> list[str]:
        return [e.state for e in self.of_type(ev.StateChanged)]

    def loud_frames(self) -> list[int]:
        """Indices of output frames with agent audio in them."""
        return [i for i, f in enumerate(self.played) if np.abs(f).max() > 300]

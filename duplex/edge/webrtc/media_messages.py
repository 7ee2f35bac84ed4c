"""What the server and a media worker tell each other (msgspec over ``media_pipe``). ``call`` is
the call's public id; audio is raw int16 PCM."""

from __future__ import annotations

import msgspec

from duplex.edge.config import EdgeConfig


class ToWorker(msgspec.Struct, tag=True, array_like=True):
    pass


class Open(ToWorker):
    """Make the call's peer and answer ``offer`` (``Answered`` or ``Refused`` comes back)."""

    call: str
    offer: str


class Play(ToWorker):
    """The next 20 ms frame (48 kHz stereo) of each playing call on the worker, due now: the
    server paces them, one message a frame time for all of a worker's calls."""

    frames: list[tuple[str, bytes]]


class Send(ToWorker):
    """A Realtime event for the call's data channel."""

    call: str
    text: str


class Flush(ToWorker):
    """Tell when what was sent has left (``Flushed``), at most ``timeout_s`` from now."""

    call: str
    timeout_s: float


class Close(ToWorker):
    call: str


class Stop(ToWorker):
    pass


class Ping(ToWorker):
    """Are you there? (``Pong``); the server's watchdog ends a worker that stops answering."""

    sent_at: float



class FromWorker(msgspec.Struct, tag=True, array_like=True):
    pass


class Ready(FromWorker):
    pid: int


class Answered(FromWorker):
    call: str
    sdp: str
    low_latency: bool


class Refused(FromWorker):
    call: str
    reason: str


class Heard(FromWorker):
    """A frame of the caller's audio (16 kHz mono), with its arrival time in the worker
    (CLOCK_MONOTONIC, the same on both sides) and its place in the caller's stream."""

    call: str
    pcm: bytes
    arrival: float
    position: int | None


class ChannelOpened(FromWorker):
    call: str


class ClientMessage(FromWorker):
    """A data-channel message of the client: ``data`` is its text as UTF-8 unless ``binary``."""

    call: str
    data: bytes
    binary: bool

    @classmethod
    def of(cls, call: str, message: str | bytes) -> ClientMessage:
        if isinstance(message, str):
            return cls(call, message.encode(), False)
        return cls(call, message, True)

    def message(self) -> str | bytes:
        return self.data if self.binary else self.data.decode()


class StateChanged(FromWorker):
    call: str
    state: str


class Failed(FromWorker):
    call: str
    reason: str


class Flushed(FromWorker):
    call: str


class Pong(FromWorker):
    """The answer, with the worst lateness of the worker's own loop since its last ``Pong``."""

    sent_at: float
    loop_lag_s: float


TO_WORKER = Open | Play | Send | Flush | Close | Stop | Ping
FROM_WORKER = (Ready | Answered | Refused | Heard | ChannelOpened | ClientMessage | StateChanged | Failed | Flushed
               | Pong)


class WorkerSpec(msgspec.Struct, frozen=True):
    """How a worker starts: where its pipe's socket is and the edge's settings (as builtins)."""

    index: int
    path: str  # the server listens on it; the worker connects
    edge: dict

    def edge_config(self) -> EdgeConfig:
        return EdgeConfig.model_validate(self.edge)

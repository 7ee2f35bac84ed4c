"""Control-plane messages (msgspec, msgpack on the wire). One tagged union, one codec."""

from __future__ import annotations

import msgspec

from duplex.runtime.contract import Request, StageError
from duplex.runtime.step_stats import StepHistogram


class ShmRef(msgspec.Struct, frozen=True):
    """Where a payload's tensor bytes wait in shared memory (the producer's segment)."""

    segment: str
    offset: int
    nbytes: int
    block_id: int


class Payload(msgspec.Struct, frozen=True):
    """A serialized value: ``meta`` is the msgpack tree with tensors replaced by descriptors;
    their bytes are in ``inline`` (small payloads) or in shared memory at ``shm``."""

    meta: bytes
    inline: bytes = b""
    shm: ShmRef | None = None


class DataReady(msgspec.Struct, tag=True):
    """Producer -> consumer: one item of a request's stream. Sent as soon as the bytes are
    written; the transfer completes when the consumer acks (which returns the credit)."""

    request_id: str
    src: str
    dst: str
    seq: int  # per (request, src, dst), from 0
    eos: bool
    payload: Payload | None
    sent_ns: int
    params: Request | None = None  # the request, on seq 0 only
    error: StageError | None = None  # the request failed at src; consumers forget it


class Ack(msgspec.Struct, tag=True):
    """Consumer -> producer: these shm blocks may be reused."""

    consumer: str
    block_ids: list[int]


class Progress(msgspec.Struct):
    """A stage took a request in, or let it go (done/aborted/failed)."""

    request_id: str
    stage: str
    event: str  # "admitted" | "released"


class ProgressReports(msgspec.Struct, tag=True):
    """Stage -> coordinator: the progress reports a stage held back, oldest first, in one message
    (see ``duplex.runtime.progress``)."""

    reports: list[Progress]


class Abort(msgspec.Struct, tag=True):
    request_id: str


class PeerRestarted(msgspec.Struct, tag=True):
    """Broadcast: a stage process was replaced; forget blocks in flight to its stages."""

    stages: list[str]


class Hello(msgspec.Struct, tag=True):
    """Broadcast while starting: a stage that hears it is subscribed and answers Ready."""

    epoch: int


class Ready(msgspec.Struct, tag=True):
    stages: list[str]
    pid: int
    epoch: int


class StatsQuery(msgspec.Struct, tag=True):
    query_id: int


class StageStats(msgspec.Struct, tag=True):
    query_id: int
    stage: str
    pid: int
    live_requests: int
    resources: dict[str, int]
    counters: dict[str, int] = {}  # cumulative: admitted, finished, aborted, dropped_late
    request_ids: list[str] = []
    steps: StepHistogram | None = None  # step times and audio made since the stage started


class Ping(msgspec.Struct, tag=True):
    query_id: int
    sent_ns: int


class Pong(msgspec.Struct, tag=True):
    query_id: int
    stage: str
    sent_ns: int


class Shutdown(msgspec.Struct, tag=True):
    pass


class StageFailed(msgspec.Struct, tag=True):
    """Stage -> coordinator: something broke outside any one request (e.g. scheduler crash)."""

    stage: str
    message: str


Message = (
    DataReady | Ack | ProgressReports | Abort | PeerRestarted | Hello | Ready | StatsQuery | StageStats | Ping
    | Pong | Shutdown | StageFailed
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)

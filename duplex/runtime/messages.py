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


class CudaRef(msgspec.Struct, frozen=True):
    """Where a payload's device tensors wait on the GPU: a block the producer keeps alive until
    the consumer's ack, inside the producer's CUDA allocation ``handle`` (a cudaIpcMemHandle;
    consumers cache what they opened per handle), at ``offset``. ``event`` is an interprocess
    event the producer recorded after writing the block: the consumer's stream waits on it
    before reading (empty when the producer synchronized instead)."""

    device: int  # CUDA device index (the producer's and the block's)
    handle: bytes
    offset: int
    nbytes: int
    event: bytes
    block_id: int


class Payload(msgspec.Struct, frozen=True):
    """A serialized value: ``meta`` is the msgpack tree with tensors replaced by descriptors;
    their bytes are in ``inline`` (small payloads) or in shared memory at ``shm``; device tensors
    that stayed on their GPU are in the device block at ``cuda``."""

    meta: bytes
    inline: bytes = b""
    shm: ShmRef | None = None
    cuda: CudaRef | None = None

    @property
    def block_ids(self) -> list[int]:
        """The producer's blocks this payload holds (to ack once read or discarded)."""
        return [ref.block_id for ref in (self.shm, self.cuda) if ref is not None]


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
    """Consumer -> producer: these blocks (shm or device) may be reused."""

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


class DeviceMemory(msgspec.Struct, frozen=True):
    """What torch's allocator holds on a stage's GPU, in bytes (per process: stages fused into
    one process report the same numbers)."""

    device: str
    allocated: int  # torch.cuda.memory_allocated: tensors alive
    reserved: int  # torch.cuda.memory_reserved: allocated plus the allocator's cache


class StageStats(msgspec.Struct, tag=True):
    query_id: int
    stage: str
    pid: int
    live_requests: int
    resources: dict[str, int]
    counters: dict[str, int] = {}  # cumulative: admitted, finished, aborted, dropped_late
    request_ids: list[str] = []
    steps: StepHistogram | None = None  # step times and audio made since the stage started
    device_memory: DeviceMemory | None = None  # a stage on a GPU


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

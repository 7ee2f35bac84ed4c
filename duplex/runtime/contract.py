"""The runtime's public contract: the one module model families (and the session's adapter)
import to talk to the runtime.

- Items: what flows between the session and the stages and between stages. Each is a tagged
  msgspec struct, so it crosses the relay as itself (``runtime/codec.py`` decodes it typed) and a
  stage checks what it got with ``isinstance``, not by looking up agreed string keys.
- Requests: a request is a ``TurnRequest`` (answer the caller), a ``SessionEnd`` (forget the
  session's state) or an ``OverlapProbe`` (only transcribe: what the caller said over the agent's
  reply); ``TurnRequest`` carries what the caller heard of an interrupted reply and the
  speculative requests it replaces.
- Errors carry a code and a message.
- ``BuildContext``: what a stage builder may know about where its stage runs.
- The computation's side of a stage: ``WorkItem`` in, ``Emit`` out (``simple`` batch functions),
  and the ``StepRunner`` / ``RowOutput`` interface of ``ar`` stages. Models import these from
  here, never from the scheduler modules.
- ``RecentSessions`` and ``heard_part`` (``runtime/per_session.py``): for stages that keep
  per-session state (a bounded store; the words of an interrupted reply the caller heard).
- ``PhraseSplitter`` (``runtime/phrases.py``): how a TTS stage cuts the streamed reply text.
- ``Payload``: the base of every struct that crosses the relay typed. The contract items are
  payloads; a model family subclasses it for what passes between its own stages (tensors, codes,
  hidden states), and the codec decodes any subclass as itself.

The end of a stream is not an item: every hop carries an ``eos`` flag, and a stage's last output
for a request is its eos output.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from duplex.audio import SESSION_RATE  # caller audio into the first stage (models read it here)
from duplex.runtime.per_session import RecentSessions, heard_cut, heard_part  # noqa: F401 (re-exported for models)
from duplex.runtime.phrases import PhraseSplitter  # noqa: F401 (re-exported for the TTS stages)

if TYPE_CHECKING:
    from duplex.runtime.kv_cache import KVPrefix, SlotBatch, SlotKVCache  # noqa: F401 (see __getattr__)

VAD_FRAME_MS = 20  # the session's default voice-activity frame (``CallerAudio.frame_ms`` says)


# -- payloads -------------------------------------------------------------------------------------
_payload_generation = 0  # bumped per Payload subclass: the codec rebuilds its typed decoder


class Payload(msgspec.Struct, tag=True):
    """Base of the structs that cross the relay as themselves. A subclass's tag (its class name
    unless it sets ``tag=``) names it on the wire, so tags must be unique across families."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        global _payload_generation
        _payload_generation += 1

    def for_client(self) -> Payload | None:
        """What a terminal stage sends the client of this output: the item itself, unless a
        family's struct carries more than the client needs (it then returns the item part)."""
        return self


def payload_generation() -> int:
    return _payload_generation


def payload_types() -> tuple[type[Payload], ...]:
    """Every ``Payload`` subclass defined so far (the codec's typed decoder covers these)."""
    found: list[type[Payload]] = []
    pending = list(Payload.__subclasses__())
    while pending:
        cls = pending.pop(0)
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return tuple(found)


# -- items ----------------------------------------------------------------------------------------
class CallerAudio(Payload):
    """A chunk of the caller's speech, float32 mono at ``SESSION_RATE``, with the session's
    voice-activity decision for each ``frame_ms`` frame of it, in order (so no stage runs a VAD
    of its own over the same audio). A chunk holds whole frames."""

    samples: Any  # np.ndarray, float32, shape (n,)
    voiced: list[bool] = []
    frame_ms: int = VAD_FRAME_MS

    @property
    def seconds(self) -> float:
        return len(self.samples) / SESSION_RATE


class Transcript(Payload):
    """What the caller said: an interim guess (``final`` False) or the turn's final text, with
    the recogniser's confidence in it where it gives one (None: it does not say)."""

    text: str
    final: bool = False
    avg_logprob: float | None = None  # mean log-probability per token of the words' last window
    no_speech_prob: float | None = None  # P(no speech) the recogniser gave that window


class AgentText(Payload):
    """A delta of the agent's reply text, in order."""

    text: str


class AgentAudio(Payload):
    """A chunk of the agent's speech, float32 mono. ``text`` is the part of the reply this chunk
    voices, where the producing stage knows it (a TTS stage does)."""

    samples: Any  # np.ndarray, float32, shape (n,)
    sample_rate: int
    text: str = ""

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate if self.sample_rate > 0 else 0.0


class ToolCallDelta(Payload):
    """A piece of the arguments of a function the model is calling, in order. The first delta of
    a ``call_id`` opens the call (``name`` is known from it on)."""

    call_id: str
    name: str
    delta: str


class ToolCallDone(Payload):
    """The model finished calling ``name``: ``arguments`` is the whole JSON text."""

    call_id: str
    name: str
    arguments: str


Item = CallerAudio | Transcript | AgentText | AgentAudio | ToolCallDelta | ToolCallDone


# -- requests -------------------------------------------------------------------------------------
class Heard(msgspec.Struct, frozen=True):
    """How much of an interrupted reply the caller heard, so a stage that keeps history keeps
    only that part. ``audio_ms`` is the reply's whole audio when the runtime had finished it,
    else None (the rest was never made)."""

    request_id: str
    audio_end_ms: int
    audio_ms: int | None = None
    # the words it heard, from the text each played audio chunk voiced (``AgentAudio.text``);
    # None when the stage that made the audio did not say
    text: str | None = None


class ToolSpec(msgspec.Struct, frozen=True):
    """A function the caller's client (or the pipeline) lets the model call. ``parameters`` is a
    JSON Schema object, checked by the session before it gets here."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}
    strict: bool = False


class ToolOutput(msgspec.Struct, frozen=True):
    """The result of a call the model made (``conversation.item.create`` of a
    ``function_call_output``). ``speak`` False: a barge-in fenced the call, so the result joins
    the history but is not answered."""

    call_id: str
    output: str
    speak: bool = True


class TurnRequest(msgspec.Struct, frozen=True, tag=True):
    """Answer the caller: the request of one user turn (or a client ``response.create``)."""

    session_id: str
    turn: int = 0
    instructions: str = ""
    heard: Heard | None = None  # of the reply this turn interrupted
    supersedes: list[str] = []  # speculative requests of this turn the caller spoke past
    max_new_tokens: int | None = None  # cap on the reply's length, where a stage generates text
    # A typed turn: the caller's words as text, not audio. The stage that recognises speech
    # passes it on as the turn's final ``Transcript`` (no audio to transcribe), so it joins the
    # same history as a spoken turn.
    text: str | None = None
    output_audio: bool = True  # False: a text-only reply; stages that voice the reply skip it
    voice: str = ""  # the voice to speak in (session.update ``voice``); "": the TTS stage's default
    options: dict[str, int | float | str | bool] = {}  # a family's own per-request knobs (benches)
    tools: list[ToolSpec] = []  # functions the model may call in this turn (session.update ``tools``)
    tool_choice: str = "auto"  # auto | none | required | the name of one of ``tools``
    tool_outputs: list[ToolOutput] = []  # results of earlier calls, to join the history first


class SessionEnd(msgspec.Struct, frozen=True, tag=True):
    """The call is over: stages that keep per-session state (history, cached KV) drop it."""

    session_id: str


class OverlapProbe(msgspec.Struct, frozen=True, tag=True):
    """Transcribe, answer nothing: the caller's audio over the agent's reply (a barge-in that
    listens asks what was said). The runtime routes it to the entry stages only and their outputs
    to the client only (``runtime/stage.py``): the stage that recognises speech streams its
    ``Transcript``s back as for a turn, no later stage ever sees the request. Refused at once
    when no entry stage is terminal (nothing would answer it)."""

    session_id: str


Request = TurnRequest | SessionEnd | OverlapProbe


# -- errors ---------------------------------------------------------------------------------------
class ErrorCode(str, enum.Enum):
    STAGE_FAILED = "stage_failed"  # the stage's computation raised for this request
    STAGE_CRASHED = "stage_crashed"  # the stage's process or scheduler died
    BAD_INPUT = "bad_input"  # the stage got an item it cannot use
    CAPACITY = "capacity"  # no KV slot / memory for the request
    TIMEOUT = "timeout"  # no progress within supervision.request_stall_s
    STAGE_DOWN = "stage_down"  # the stage is not running (restart budget spent or restart failed)
    ABORTED = "aborted"
    SHUTTING_DOWN = "shutting_down"  # the server stopped before the request ended
    INTERNAL = "internal"


class StageError(msgspec.Struct, frozen=True):
    code: ErrorCode
    message: str
    stage: str = ""

    def __str__(self) -> str:
        where = f"stage {self.stage}: " if self.stage else ""
        return f"{where}{self.message} ({self.code.value})"


# -- building a stage -----------------------------------------------------------------------------
class BuildContext(msgspec.Struct, frozen=True):
    """What a stage builder may know: its stage's name and ``args`` (free-form by design: each
    builder checks its own and names any it does not know), and where the stage runs."""

    stage: str
    args: dict[str, Any] = {}
    device: str = "cpu"
    memory_bytes: int | None = None  # the stage's budget; None when the config sets none
    threads: int = 1
    max_running_requests: int = 1  # the scheduler's cap (AR stages size their KV cache to it)


Builder = Callable[[BuildContext], object]


# -- a stage's computation ------------------------------------------------------------------------
CLIENT = "client"  # the ``source`` of inputs that come from the coordinator (caller audio, text)


def _no_request() -> Request:
    return TurnRequest(session_id="")


@dataclass
class WorkItem:
    """One input for one request, in the order its source produced it."""

    request_id: str
    source: str  # upstream stage name, or CLIENT
    data: Any
    eos: bool  # True on the last input this stage gets for the request (all sources ended)
    params: Request = field(default_factory=_no_request)  # the request this input belongs to


@dataclass
class Emit:
    """One output for one request. ``eos`` marks the stage's last output for it.

    ``error`` set means the request failed in this stage (the shell reports it and forgets the
    request); ``data`` is then ignored.
    """

    request_id: str
    data: Any = None
    eos: bool = False
    error: StageError | None = None


@dataclass
class RowOutput:
    """What one row of an ``ar`` step produced: chunks to emit, and whether the request is done."""

    emits: list[Any] = field(default_factory=list)
    done: bool = False
    final: Any = None  # data of the eos emit when done
    error: str | None = None


class StepRunner(Protocol):
    """A model's side of an ``ar`` stage. Slots are chosen by the scheduler, in [0, capacity)."""

    capacity: int

    def open(self, slot: int, request_id: str, request: Request) -> None: ...

    def feed(self, slot: int, source: str, data: Any, eos: bool) -> None:
        """One input of the request in ``slot``; raise ValueError for bad input (fails that request)."""

    def ready(self, slot: int) -> bool:
        """Whether the row has work for the next step (inputs arrived, not waiting on feedback)."""

    def plan(self, slots: list[int]) -> Any:
        """Book one step for these rows (scheduler thread; no tensor reads of earlier steps)."""

    def compute(self, plan: Any) -> Any:
        """Run the step (worker thread, in plan order)."""

    def resolve(self, plan: Any, raw: Any) -> dict[int, RowOutput]: ...

    def close(self, slot: int) -> None:
        """Drop every bit of the slot's state; the slot may be reused next."""

    # Optional: ``releases_in_flight = True`` lets an aborted row's slot go back at once, while a
    # step that holds it is still computing (see ``runtime/schedulers/ar.py``).

    def held(self) -> dict[str, int]:
        """Extra resources the runner holds (e.g. ``feedback_rows``), for stats."""


class StreamRunner(Protocol):
    """A model's side of a ``stream`` stage: each request is one asyncio task on the stage's event
    loop, for computations that wait on I/O (an engine over HTTP) rather than compute.

    ``run`` is an async generator: it reads the request's inputs from ``inputs`` (``WorkItem``s,
    the last with ``eos``) and yields outputs as they come; returning ends the request (eos).
    Raising ``ValueError`` fails the request as bad input, any other exception as a stage
    failure, with ``str(exc)`` as the message. An abort cancels the task: ``run`` must release
    what it holds (close its stream) in ``finally``."""

    def run(self, request_id: str, request: Request, inputs: AsyncIterator[WorkItem]) -> AsyncIterator[Any]: ...

    def held(self) -> dict[str, int]:
        """Resources the runner holds (e.g. ``open_streams``), for stats."""


# -- the slot KV cache ----------------------------------------------------------------------------
_KV_CACHE_NAMES = ("KVPrefix", "SlotBatch", "SlotKVCache")  # in ``runtime/kv_cache.py``


def __getattr__(name: str) -> Any:
    """The slot KV cache (``SlotKVCache``, ``SlotBatch``, ``KVPrefix``) needs torch: it loads on
    first use, by the stages that have a KV cache, not in every process that reads the contract."""
    if name in _KV_CACHE_NAMES:
        from duplex.runtime import kv_cache

        return getattr(kv_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Typed pipeline config: which stages, their schedulers, placement, budgets and edges."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from duplex.config.graph import validate_graph
from duplex.config.session import SessionConfig

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def parse_size(value: str | int) -> int:
    """'512MiB' -> 536870912; plain integers are bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if not match or match.group(2).upper() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (examples: 512MiB, 2GiB, 1000000)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimpleSchedulerConfig(_Strict):
    kind: Literal["simple"] = "simple"
    max_batch_size: int = Field(1, ge=1)
    max_wait_ms: float = Field(0.0, ge=0)


class ARSchedulerConfig(_Strict):
    kind: Literal["ar"] = "ar"
    max_running_requests: int = Field(8, ge=1)
    lookahead: bool = True  # compute step N while step N-1's outputs are shipped


class FeedbackARSchedulerConfig(_Strict):
    kind: Literal["feedback_ar"] = "feedback_ar"
    max_running_requests: int = Field(8, ge=1)
    lookahead: bool = True


class StreamSchedulerConfig(_Strict):
    """``stream``: one asyncio task per request (computations that wait on I/O, e.g. an engine
    reached over HTTP, which batches requests itself)."""

    kind: Literal["stream"] = "stream"
    max_running_requests: int = Field(64, ge=1)  # requests in flight at once; more wait their turn


SchedulerConfig = Annotated[
    SimpleSchedulerConfig | ARSchedulerConfig | FeedbackARSchedulerConfig | StreamSchedulerConfig,
    Field(discriminator="kind"),
]
SCHEDULER_CONFIGS: dict[str, type[BaseModel]] = {
    "simple": SimpleSchedulerConfig,
    "ar": ARSchedulerConfig,
    "feedback_ar": FeedbackARSchedulerConfig,
    "stream": StreamSchedulerConfig,
}


CPU_STAGE_NICE = 10  # a CPU stage's default nice: CFS then gives a nice-0 process ~9x its share


class StageConfig(_Strict):
    name: str
    builder: str
    scheduler: SchedulerConfig = Field(default_factory=SimpleSchedulerConfig)
    process: str | None = None  # stages naming the same process are fused into it
    device: str = "cpu"
    memory: float | int = 0.05  # fraction of the device (<= 1.0) or bytes
    threads: int = Field(1, ge=1)
    # How much of the CPU the stage's process yields when the cores are contended (Linux nice,
    # 0-19). The server's event loop and media workers hear the caller and stop the agent: on a
    # CPU-bound box a model step must not delay that. None: 10 on the CPU, 0 on a GPU (there the
    # process feeds the device and its launches are the device's pace) and 0 for a stream stage
    # (it computes nothing: it relays an engine's reply, which a nice-0 engine on the same cores
    # would otherwise hold up).
    nice: int | None = Field(None, ge=0, le=19)
    next: list[str] = Field(default_factory=list)
    stream_to: list[str] = Field(default_factory=list)
    wait_for: list[str] = Field(default_factory=list)
    terminal: bool = False
    terminal_keys: list[str] | None = None  # terminal dict outputs: only these keys reach the client
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _NAME_RE.match(name) or name in {"client", "coordinator"}:
            raise ValueError(f"stage name {name!r}: letters, digits, _ and -; not client/coordinator")
        return name

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("device")
    @classmethod
    def _check_device(cls, device: str) -> str:
        if not re.match(r"^(cpu|cuda(:\d+)?)$", device):
            raise ValueError(f"device {device!r}: use cpu, cuda or cuda:N")
        return "cuda:0" if device == "cuda" else device  # one name per card: budgets add up per name

    @property
    def process_name(self) -> str:
        return self.process or self.name

    @property
    def niceness(self) -> int:
        if self.nice is not None:
            return self.nice
        computes = self.device == "cpu" and not isinstance(self.scheduler, StreamSchedulerConfig)
        return CPU_STAGE_NICE if computes else 0


class ControlConfig(_Strict):
    transport: Literal["ipc", "tcp"] = "ipc"
    host: str = "127.0.0.1"  # tcp: address stages bind on
    base_port: int = Field(0, ge=0, le=65535)  # tcp: coordinator at base_port, stages after; 0 = pick free


class RelayConfig(_Strict):
    inline_max_bytes: int = Field(64 * 1024, ge=0)  # payloads up to this ride inside the message
    credits_per_peer: int = Field(64, ge=1)  # shm blocks in flight to one consumer
    pool_bytes: int = Field(512 * 2**20, ge=2**20)  # shm a producing stage may hold at once
    ack_timeout_s: float = Field(30.0, gt=0)
    # large device tensors between stages on GPUs of one host go by CUDA IPC; off: through the host
    cuda_ipc: bool = True

    @field_validator("pool_bytes", mode="before")
    @classmethod
    def _pool_size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value


class SupervisionConfig(_Strict):
    """How the coordinator keeps its stages alive (``duplex.runtime.supervisor``)."""

    restart: bool = True
    max_restarts: int = Field(5, ge=0)  # restarts per stage process within restart_window_s (a rate)
    restart_window_s: float = Field(60.0, gt=0)  # ... past it, a spent budget refills: a down stage is retried
    ready_timeout_s: float = Field(120.0, gt=0)  # model loading happens before ready
    watchdog_interval_s: float = Field(0.5, gt=0)  # how often each stage process is pinged
    # a process that answers no ping for this long is killed (SIGKILL) and restarted; 0 = no watchdog.
    # Generous: pings are answered by the stage's I/O thread, between and during model steps.
    watchdog_timeout_s: float = Field(5.0, ge=0)
    # how long /duplex/stats waits for the stages' stats: one that has not answered by then (stopped,
    # wedged) is shown as not answering, with the age of its last stats, instead of holding the answer
    stats_timeout_s: float = Field(0.5, gt=0)
    # a request with no output, progress report or input for this long fails (timeout); 0 = never
    request_stall_s: float = Field(30.0, ge=0)


class AdmissionConfig(_Strict):
    """Admission by load (``duplex.server.admission``): a new call is refused (503 + Retry-After)
    when the estimate of a new turn's wait would pass ``turn_budget_ms``, or the event loop runs
    late by more than ``max_loop_lag_ms``. Load never refuses while no call is live (there is no
    one to protect, and the first caller's own latency is the floor). Defaults refuse nothing on a
    moderately loaded 2-core box; tighten them per deployment."""

    enabled: bool = True
    turn_budget_ms: float = Field(4000.0, gt=0)  # loop lag + per stage queued batches x recent step time
    max_loop_lag_ms: float = Field(500.0, gt=0)  # worst lateness of a periodic timer in lag_window_s
    lag_window_s: float = Field(2.0, gt=0)
    sample_interval_s: float = Field(0.5, gt=0)  # how often the stages' queues and step times are sampled
    probe_interval_s: float = Field(0.05, gt=0)  # the event-loop lag timer's period
    retry_after_s: int = Field(2, ge=1)  # Retry-After of an overload refusal


class PipelineConfig(_Strict):
    name: str
    stages: list[StageConfig]
    entry: list[str] | None = None  # default: stages no other stage feeds
    devices: dict[str, int] = Field(default_factory=dict)  # device -> bytes (cpu: physical memory)
    control: ControlConfig = Field(default_factory=ControlConfig)
    relay: RelayConfig = Field(default_factory=RelayConfig)
    supervision: SupervisionConfig = Field(default_factory=SupervisionConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    # Default settings of the sessions served on this pipeline (checked at load, like the rest):
    # e.g. preemptive_generation, end_of_session_request, turn_detection.
    session: SessionConfig = Field(default_factory=SessionConfig)

    @field_validator("devices", mode="before")
    @classmethod
    def _device_sizes(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: parse_size(v) if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_graph(self) -> PipelineConfig:
        validate_graph(self)
        return self

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def entry_stages(self) -> list[str]:
        if self.entry is not None:
            return list(self.entry)
        fed = {dst for s in self.stages for dst in (*s.next, *s.stream_to)}
        return [s.name for s in self.stages if s.name not in fed]

    @property
    def terminal_stages(self) -> list[str]:
        return [s.name for s in self.stages if s.terminal]

    def upstreams(self, name: str) -> list[str]:
        """Sources a stage receives from: upstream stages, and 'client' for entry stages."""
        sources = [s.name for s in self.stages if name in s.next or name in s.stream_to]
        if name in self.entry_stages:
            sources.insert(0, "client")
        return sources

    def processes(self) -> dict[str, list[StageConfig]]:
        groups: dict[str, list[StageConfig]] = {}
        for stage in self.stages:
            groups.setdefault(stage.process_name, []).append(stage)
        return groups

"""What `duplex bench soak` samples every few seconds: the server's processes on this host (the
edge, each stage process and whatever those start) - resident memory, open file descriptors,
threads -, its shared-memory segments under /dev/shm, and from ``/duplex/stats`` what each stage
holds (live requests, KV slots, feedback rows, relay blocks, queues) and how many calls are live.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import psutil

from duplex.runtime import shm
from duplex_tools.bench.load import server_processes
from duplex_tools.scenario.server_stats import ServerStats, StatsError

MIB = 1024 * 1024


@dataclass
class Sample:
    phase: str  # before | warm-up | warmed (idle after warm-up) | run | final (idle after all)
    t_s: float  # since the soak began
    barge_ins: int  # made so far: those of finished calls plus the live sessions' counters
    calls: int  # finished
    live_calls: int
    rss_mib: float  # the edge and every process under it
    rss_by_process: dict[str, float]  # "edge", then per stage (its children included)
    fds: int
    threads: int
    fds_by_process: dict[str, int]
    threads_by_process: dict[str, int]
    shm_segments: int
    shm_mib: float
    held: dict[str, int]  # per stage: live requests plus every resource it reports
    held_detail: dict[str, dict[str, int]] = field(default_factory=dict)  # the nonzero ones, by kind

    def to_json(self) -> dict:
        return asdict(self)


class ServerSampler:
    """One server's process tree and stats; ``take`` reads them all once."""

    def __init__(self, url: str, edge: psutil.Process) -> None:
        self.edge = edge
        self.shm_prefix = f"{shm.PREFIX}{edge.pid}-"  # run ids start with the coordinator's (edge's) pid
        self._stats = ServerStats(url)
        self._t0 = time.monotonic()

    @classmethod
    async def find(cls, url: str) -> ServerSampler | None:
        """The sampler of the server at ``url``, or None when its processes are not on this host."""
        found = await server_processes(url)
        pids = {p.pid for p in found}
        parents = [p for p in found if any(other.ppid() == p.pid for other in found if other.pid in pids)]
        return cls(url, parents[0]) if parents else None

    async def close(self) -> None:
        await self._stats.close()

    async def take(self, phase: str, barge_ins_done: int, calls: int) -> Sample:
        try:
            current = await self._stats.get()
        except (StatsError, OSError):
            current = {}
        sessions = current.get("sessions", {})
        live_barge_ins = sum(int(s.get("barge_ins", 0)) for s in sessions.get("sessions", {}).values())
        rss, fds, threads = self._processes(current)
        segments = shm.list_segments(self.shm_prefix)
        return Sample(phase, round(time.monotonic() - self._t0, 2), barge_ins_done + live_barge_ins, calls,
                      int(sessions.get("live", 0)), round(sum(rss.values()), 2), rss, sum(fds.values()),
                      sum(threads.values()), fds, threads, len(segments), round(_bytes(segments) / MIB, 3),
                      *_held(current))

    def _processes(self, current: dict) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
        """RSS, open fds and threads by group: the edge, each stage (with its children), and the
        edge's other children (multiprocessing's resource tracker)."""
        stage_of = {int(s["pid"]): name for name, s in current.get("stages", {}).items() if "pid" in s}
        rss: dict[str, float] = {}
        fds: dict[str, int] = {}
        threads: dict[str, int] = {}
        try:
            tree = [self.edge, *self.edge.children(recursive=True)]
        except psutil.Error:
            return rss, fds, threads  # the server is gone
        for process in tree:
            try:
                with process.oneshot():
                    group = "edge" if process.pid == self.edge.pid else _group(process, stage_of)
                    rss[group] = round(rss.get(group, 0.0) + process.memory_info().rss / MIB, 2)
                    fds[group] = fds.get(group, 0) + process.num_fds()
                    threads[group] = threads.get(group, 0) + process.num_threads()
            except psutil.Error:
                continue  # it ended between the listing and the reading
        return rss, fds, threads


def _group(process: psutil.Process, stage_of: dict[int, str]) -> str:
    """The stage a process belongs to: itself, or the nearest ancestor that is a stage."""
    for candidate in (process, *process.parents()):
        if candidate.pid in stage_of:
            return stage_of[candidate.pid]
    return "edge-children"


def _held(current: dict) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    held: dict[str, int] = {}
    detail: dict[str, dict[str, int]] = {}
    for name, stage in current.get("stages", {}).items():
        kinds = {"live_requests": int(stage.get("live_requests", 0)),
                 **{k: int(v) for k, v in stage.get("resources", {}).items()}}
        held[name] = sum(kinds.values())
        if held[name]:
            detail[name] = {k: v for k, v in kinds.items() if v}
    return held, detail


def _bytes(segments: list[str]) -> int:
    total = 0
    for name in segments:
        try:
            total += (shm.SHM_DIR / name).stat().st_size
        except FileNotFoundError:
            continue  # unlinked since the listing
    return total

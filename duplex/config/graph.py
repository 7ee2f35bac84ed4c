"""Structural checks of a pipeline: names, edges, cycles, fan-in, terminals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Stage(Protocol):
    name: str
    next: list[str]
    stream_to: list[str]
    wait_for: list[str]


class _Pipeline(Protocol):
    """What the checks read of a pipeline (``pipeline.PipelineConfig``, which calls them)."""

    @property
    def stages(self) -> Sequence[_Stage]: ...
    @property
    def entry(self) -> list[str] | None: ...
    @property
    def entry_stages(self) -> list[str]: ...
    @property
    def terminal_stages(self) -> list[str]: ...
    def stage(self, name: str) -> _Stage: ...


class ConfigError(ValueError):
    """A pipeline config that cannot run; the message names the offending key."""


def validate_graph(cfg: _Pipeline) -> None:
    names = [s.name for s in cfg.stages]
    if not names:
        raise ConfigError("stages: a pipeline needs at least one stage")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"stages: duplicate stage names {duplicates}")
    known = set(names)
    for i, stage in enumerate(cfg.stages):
        for field in ("next", "stream_to", "wait_for"):
            for target in getattr(stage, field):
                if target not in known:
                    raise ConfigError(
                        f"stages[{i}].{field}: stage {stage.name!r} points to unknown stage {target!r}"
                    )
                if target == stage.name and field != "wait_for":
                    raise ConfigError(f"stages[{i}].{field}: stage {stage.name!r} points to itself")
        for source in stage.wait_for:
            upstream = cfg.stage(source)
            if stage.name not in upstream.next:
                raise ConfigError(
                    f"stages[{i}].wait_for: {stage.name!r} waits for {source!r}, "
                    f"but {source!r} does not list {stage.name!r} in next"
                )
    if cfg.entry is not None:
        for target in cfg.entry:
            if target not in known:
                raise ConfigError(f"entry: unknown stage {target!r}")
    if not cfg.entry_stages:
        raise ConfigError("entry: every stage is fed by another stage; no entry stage (a cycle?)")
    if not cfg.terminal_stages:
        raise ConfigError("stages: no stage is terminal: true; nothing would reach the client")
    _refuse_cycles(cfg)
    _refuse_unreachable(cfg)


def _refuse_cycles(cfg: _Pipeline) -> None:
    edges = {s.name: set(s.next) | set(s.stream_to) for s in cfg.stages}
    state: dict[str, int] = {}  # 1 = on the path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                raise ConfigError(f"stages: cycle {' -> '.join(cycle)} (edges via next/stream_to)")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in edges:
        if name not in state:
            visit(name, [name])


def _refuse_unreachable(cfg: _Pipeline) -> None:
    edges = {s.name: set(s.next) | set(s.stream_to) for s in cfg.stages}
    seen = set(cfg.entry_stages)
    frontier = list(seen)
    while frontier:
        for nxt in edges[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    dangling = [s.name for s in cfg.stages if s.name not in seen]
    if dangling:
        raise ConfigError(f"stages: {dangling} cannot be reached from the entry stages {cfg.entry_stages}")

"""Load a pipeline from YAML, apply dotted command-line overrides, report errors by key."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from duplex.config.graph import ConfigError
from duplex.config.pipeline import SCHEDULER_CONFIGS, PipelineConfig, StageConfig

# The bundled pipelines ship inside the package (package data), so a wheel install finds them
# from any working directory.
BUNDLED_CONFIGS = files("duplex") / "configs"


def bundled_config_names() -> list[str]:
    if not BUNDLED_CONFIGS.is_dir():  # an install that lost its package data
        return []
    return sorted(entry.name.removesuffix(".yaml") for entry in BUNDLED_CONFIGS.iterdir()
                  if entry.name.endswith(".yaml"))


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A YAML file as given, or the name of a bundled config ('local' -> duplex/configs/local.yaml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = BUNDLED_CONFIGS / f"{name_or_path}.yaml"
    if path.name == str(name_or_path) and bundled.is_file():
        return Path(str(bundled))
    raise ConfigError(f"config file not found: {name_or_path} "
                      f"(bundled configs: {', '.join(bundled_config_names()) or 'none'})")


def load_pipeline(path: str | Path, overrides: list[str] | dict[str, Any] | None = None) -> PipelineConfig:
    path = resolve_config_path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return pipeline_from_dict(raw, overrides, source=str(path))


def pipeline_from_dict(
    raw: dict[str, Any], overrides: list[str] | dict[str, Any] | None = None, source: str = "config"
) -> PipelineConfig:
    raw = _deep_copy(raw)
    pairs = parse_override_args(overrides) if isinstance(overrides, list) else dict(overrides or {})
    for key, value in pairs.items():
        apply_override(raw, key, value)
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + _describe(exc, raw)) from None


def parse_override_args(args: list[str]) -> dict[str, Any]:
    """['--thinker.max_running_requests', '8', '--a.b=c'] -> {'thinker.max_running_requests': 8, ...}"""
    pairs: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) <= 2:
            raise ConfigError(f"override {arg!r}: expected --dotted.key VALUE")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            i += 2
        else:
            raise ConfigError(f"override --{key}: missing value")
        pairs[key] = yaml.safe_load(value)  # '8' -> 8, 'true' -> True, '[a, b]' -> list
    return pairs


def apply_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted key. A first part naming a stage addresses that stage; a stage key that is
    not a stage field but a field of its scheduler kind goes to the scheduler."""
    parts = dotted.split(".")
    stages = raw.setdefault("stages", [])
    by_name = {s.get("name"): s for s in stages if isinstance(s, dict)}
    if parts[0] in by_name:
        node: dict[str, Any] = by_name[parts[0]]
        parts = parts[1:]
        if not parts:
            raise ConfigError(f"override {dotted}: names a stage, not a key in it")
        if parts[0] not in StageConfig.model_fields:
            node = _scheduler_node(node, dotted)
    elif parts[0] == "stages":
        raise ConfigError(f"override {dotted}: address a stage by its name, e.g. --thinker.threads 2")
    else:
        node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def _scheduler_node(stage: dict[str, Any], dotted: str) -> dict[str, Any]:
    scheduler = stage.get("scheduler", "simple")
    if isinstance(scheduler, str):
        scheduler = {"kind": scheduler}
        stage["scheduler"] = scheduler
    kind = scheduler.get("kind", "simple")
    fields = SCHEDULER_CONFIGS.get(kind)
    key = dotted.split(".")[1]
    if fields is None or key not in fields.model_fields:
        known = sorted(set(StageConfig.model_fields) | set(fields.model_fields if fields else ()))
        raise ConfigError(f"override {dotted}: unknown key {key!r} for stage {stage.get('name')!r} "
                          f"(scheduler {kind}); known: {', '.join(known)}")
    return scheduler


def _describe(exc: ValidationError, raw: dict[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = _readable_loc(err["loc"], raw)
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key {loc}")
        elif err["type"] == "value_error":
            message = str(err.get("ctx", {}).get("error", err["msg"]))
            lines.append(f"{loc}: {message}" if loc else message)
        else:
            lines.append(f"{loc}: {err['msg']}")
    return "; ".join(lines)


def _readable_loc(loc: tuple, raw: dict[str, Any]) -> str:
    """('stages', 1, 'simple', 'max_batch') -> 'stages[1] (thinker).scheduler.max_batch'."""
    out = []
    items = list(loc)
    i = 0
    while i < len(items):
        part = items[i]
        if part == "stages" and i + 1 < len(items) and isinstance(items[i + 1], int):
            idx = items[i + 1]
            stage = raw.get("stages", [])[idx] if idx < len(raw.get("stages", [])) else {}
            name = stage.get("name") if isinstance(stage, dict) else None
            out.append(f"stages[{idx}]" + (f" ({name})" if name else ""))
            i += 2
            if i < len(items) and items[i] == "scheduler":
                out.append("scheduler")
                i += 2 if i + 1 < len(items) and items[i + 1] in SCHEDULER_CONFIGS else 1
            continue
        out.append(str(part))
        i += 1
    return ".".join(out)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value

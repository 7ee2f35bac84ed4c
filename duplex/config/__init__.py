"""Pipeline configuration: typed models, YAML loading, overrides, and the checks run before start."""

from collections.abc import Mapping

from duplex.config.graph import ConfigError
from duplex.config.loader import load_pipeline, parse_override_args, pipeline_from_dict
from duplex.config.pipeline import PipelineConfig, StageConfig, parse_size
from duplex.config.placement import check_placement, stage_budget_bytes


def check_builders(cfg: PipelineConfig, builders: Mapping[str, object]) -> None:
    for i, stage in enumerate(cfg.stages):
        if stage.builder not in builders:
            raise ConfigError(
                f"stages[{i}] ({stage.name}).builder: unknown builder {stage.builder!r}; "
                f"known: {', '.join(sorted(builders))}"
            )


def check_pipeline(cfg: PipelineConfig, builders: Mapping[str, object]) -> None:
    """Every check that must pass before any process starts."""
    check_builders(cfg, builders)
    check_placement(cfg)


__all__ = [
    "ConfigError", "PipelineConfig", "StageConfig", "check_builders", "check_pipeline",
    "check_placement", "load_pipeline", "parse_override_args", "parse_size", "pipeline_from_dict",
    "stage_budget_bytes",
]

"""``JobConfig``: the whole job, validated across sections (see :mod:`engine.train.config`).

JSON layout (every section but ``model``, ``data`` and ``schedule`` is optional)::

    {"version": 1, "name": "mnli-small", "method": "comera",
     "model": {"arch": "transformer", "config": {"d_model": 64, ...}},
     "data": {"kind": "synthetic", ...},
     "compression": {"max_rank": 8, "penalty": "cost_weighted", "shrink_every": 50, ...},
     "schedule": [{"kind": "early", "epochs": 2}, {"kind": "late", "steps": 200,
                   "target_ratio": 0.5}, {"kind": "finetune", "steps": 50}],
     "training": {"batch_size": 32, "seed": 0},
     "checkpoint": {"every_steps": 100, "keep": 2},
     "galore": {"rank": 128}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from engine.data.config import DataConfig
from engine.train.config import (
    CONFIG_VERSION,
    METHODS,
    CheckpointConfig,
    CompressionConfig,
    ConfigError,
    GaloreConfig,
    ModelConfig,
    StageConfig,
    TrainingConfig,
    as_config_error,
    default_compression,
)

__all__ = ["JobConfig", "MAX_STAGES"]

MAX_STAGES = 32


def _data_from_dict(data: object) -> DataConfig:
    return DataConfig.from_dict(data, "data")


@dataclass(frozen=True)
class JobConfig:
    model: ModelConfig
    data: DataConfig
    schedule: tuple[StageConfig, ...]
    method: str = "comera"
    name: str = "job"
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    galore: GaloreConfig = field(default_factory=GaloreConfig)
    version: int = CONFIG_VERSION

    @property
    def tensorized(self) -> bool:
        return self.method == "comera"

    def total_steps(self, per_epoch: int | None) -> int | None:
        """Optimizer steps of the whole schedule (a ``steps: "auto"`` stage at its bound) with
        ``per_epoch`` batches an epoch, or None when a stage's length is unknown."""
        lengths = [stage.length(per_epoch) for stage in self.schedule]
        return None if None in lengths else sum(lengths)  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: object) -> JobConfig:
        if not isinstance(data, Mapping):
            raise ConfigError("", f"must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(unknown[0], f"unknown field (known: {sorted(known)})")
        d = dict(data)
        version = d.get("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise ConfigError("version", f"must be {CONFIG_VERSION}, got {version!r}")
        method = d.get("method", "comera")
        if method not in METHODS:
            raise ConfigError("method", f"must be one of {list(METHODS)}, got {method!r}")
        name = d.get("name", "job")
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise ConfigError("name", "must be a string of 1-128 characters")
        for required in ("model", "data", "schedule"):
            if required not in d:
                raise ConfigError(required, "is required")
        model = ModelConfig.from_dict(d["model"], "model")
        sched = d["schedule"]
        if not isinstance(sched, list) or not 0 < len(sched) <= MAX_STAGES:
            raise ConfigError("schedule", f"must be a list of 1-{MAX_STAGES} stages")
        stages = tuple(StageConfig.from_dict(s, f"schedule[{i}]") for i, s in enumerate(sched))
        for i, stage in enumerate(stages):
            if stage.kind == "late" and method != "comera":
                raise ConfigError(
                    f"schedule[{i}].kind",
                    f"a 'late' stage needs ranks to "
                    f"shrink: method {method!r} has none (use 'comera')",
                )
        given = d.get("compression", {})
        compression = default_compression(
            CompressionConfig.from_dict(given, "compression"),
            given,
            sched,
            arch=model.arch,
            method=method,
        )
        job = cls(
            model=model,
            data=_data_from_dict(d["data"]),
            schedule=stages,
            method=method,
            name=name,
            compression=compression,
            training=TrainingConfig.from_dict(d.get("training", {}), "training"),
            checkpoint=CheckpointConfig.from_dict(d.get("checkpoint", {}), "checkpoint"),
            galore=GaloreConfig.from_dict(d.get("galore", {}), "galore"),
            version=version,
        )
        job.model_config()  # model.config fields checked now, not at build time
        return job

    def model_config(self, overrides: Mapping[str, Any] | None = None) -> Any:
        """The architecture's config object: data-derived ``overrides`` under user fields."""
        from engine.models.registry import get_workload

        merged = {**(overrides or {}), **dict(self.model.config)}
        try:
            return get_workload(self.model.arch).config_from_dict(merged)
        except (ValueError, TypeError) as err:
            raise as_config_error(err, "model.config") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            "method": self.method,
            "model": self.model.to_dict(),
            "data": self.data.to_dict(),
            "compression": self.compression.to_dict(),
            "schedule": [s.to_dict() for s in self.schedule],
            "training": self.training.to_dict(),
            "checkpoint": self.checkpoint.to_dict(),
            "galore": self.galore.to_dict(),
        }

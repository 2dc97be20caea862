"""The dry-run plan of a job: what the worker would build for it, without training anything.

``plan_job(job)`` takes the engine job dict (``service.spec.to_engine``), validates it as the
worker will (``JobConfig.from_dict``, then building the model, so a stage or an option that
does not fit the model fails here with the engine's ``ConfigError`` naming the field), and
returns per-layer shapes, modes and initial ranks, parameter counts before and after, the
tensorized ratio, a training-memory estimate and the total number of steps when known.

The models are built on the ``meta`` device: shapes and counts without allocating weights.
Model fields that the data decides (vocabulary, classes, input width) come from a sample of
at most ``SAMPLE_ROWS`` rows of a synthetic data set, from ``data.num_rows`` for Criteo files,
and from ``model.config`` or its defaults for other files (the worker reads those files).

Memory estimate (bytes, fp32 training with Adam): every trainable parameter costs
4 (weight) + 4 (gradient) + 8 (two Adam moments) = 16 bytes; activations are estimated as
2 x 4 bytes x tokens per batch x the summed output widths of every linear and embedding layer
(the layer output plus one same-size intermediate kept for backward), plus for attention
models 2 x 4 bytes x batch x heads x seq^2 x layers (scores and probabilities). Tokens per
batch are ``batch_size x seq_len`` for sequence models and ``batch_size`` otherwise.

Runs in the planner's child process (``service.planner``), never in the API process.
"""

from __future__ import annotations

import math
import tempfile
from typing import Any

import torch
from torch import nn

from engine.data import build_data
from engine.data.criteo import dlrm_overrides
from engine.export.manifest import layer_record
from engine.models.registry import get_workload
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank.size import tensorized_layers
from engine.train.config import ConfigError, as_config_error
from engine.train.job import JobConfig

__all__ = ["SAMPLE_ROWS", "plan_job"]

SAMPLE_ROWS = 2048
SEQUENCE_ARCHS = ("transformer", "mlm")


def _data_facts(cfg: JobConfig) -> tuple[dict[str, Any], int | None, list[str]]:
    """(model overrides from the data, training batches per epoch or None, warnings)."""
    data, arch, bs = cfg.data, cfg.model.arch, cfg.training.batch_size
    if data.kind == "criteo":
        return dlrm_overrides(data.table_rows()), None, []
    if data.kind != "synthetic":
        return {}, None, [f"model fields derived from the {data.kind!r} file (vocabulary, "
                          "classes, input width) are taken from model.config or its defaults "
                          "here; the worker derives them from the file"]  # fmt: skip
    sample = data.replace(n_train=min(data.n_train, SAMPLE_ROWS),
                          n_valid=min(data.n_valid, SAMPLE_ROWS // 8))  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="comera-plan-") as tmp:
            bundle = build_data(sample, arch=arch, batch_size=bs, seed=cfg.training.seed,
                                workdir=tmp, model_config=cfg.model.config)  # fmt: skip
    except ValueError as err:
        raise as_config_error(err, "data") from None
    warnings = []
    if data.n_train > SAMPLE_ROWS:
        warnings.append(f"model fields derived from the data come from a sample of "
                        f"{SAMPLE_ROWS} generated rows")  # fmt: skip
    per_epoch = None
    if arch != "mlm":  # masked-LM packs lines into sequences: unknown without a full pass
        per_epoch = data.n_train // bs if data.drop_last else math.ceil(data.n_train / bs)
    return dict(bundle.model_overrides), per_epoch, warnings


def _layer_plan(name: str, layer: TTLinear | TTMEmbedding) -> dict[str, Any]:
    rec = layer_record(name, layer)
    if rec["kind"] == "tt_linear":
        shape = [rec["in_features"], rec["out_features"]]
        modes = {"in": rec["in_modes"], "out": rec["out_modes"]}
    else:
        shape = [rec["num_embeddings"], rec["embedding_dim"]]
        modes = {"rows": rec["row_modes"], "cols": rec["col_modes"]}
    return {"name": name, "kind": rec["kind"], "shape": shape, "modes": modes,
            "initial_ranks": rec["ranks"], "dense_params": rec["dense_params"],
            "params": rec["params"]}  # fmt: skip


def _memory_bytes(model: nn.Module, cfg: JobConfig, model_config: Any) -> int:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    batch = cfg.training.batch_size
    seq = 1
    if cfg.model.arch in SEQUENCE_ARCHS:
        seq = min(cfg.data.max_len, getattr(model_config, "max_len", cfg.data.max_len))
    widths = 0
    for m in model.modules():
        if isinstance(m, nn.Linear | TTLinear):
            widths += m.out_features
        elif isinstance(m, nn.Embedding | TTMEmbedding):
            widths += m.embedding_dim
    activations = 2 * 4 * batch * seq * widths
    heads, layers = getattr(model_config, "n_heads", 0), getattr(model_config, "n_layers", 0)
    if cfg.model.arch in SEQUENCE_ARCHS:
        activations += 2 * 4 * batch * heads * seq * seq * layers
    return 16 * trainable + activations


def _total_steps(cfg: JobConfig, per_epoch: int | None) -> int | None:
    total = 0
    for stage in cfg.schedule:
        if stage.steps is not None:
            total += stage.steps
        elif per_epoch is None:
            return None
        else:
            total += per_epoch * (stage.epochs or 0)
    return total


def _build(cfg: JobConfig, model_config: Any, tensorized: bool) -> nn.Module:
    workload = get_workload(cfg.model.arch)
    try:
        with torch.device("meta"):
            return workload.build(workload.plan_config(model_config), tensorized=tensorized,
                                  options=cfg.compression.options)  # fmt: skip
    except ValueError as err:  # a stage or option that does not fit the model
        raise as_config_error(err, "compression") from None


def plan_job(job: dict[str, Any]) -> dict[str, Any]:
    """The plan of the engine job dict ``job``; raises ``ConfigError`` naming the field."""
    cfg = JobConfig.from_dict(job)
    overrides, per_epoch, warnings = _data_facts(cfg)
    model_config = cfg.model_config(overrides)
    dense = _build(cfg, model_config, tensorized=False)
    model = _build(cfg, model_config, tensorized=True) if cfg.tensorized else dense
    tt = tensorized_layers(model)
    if cfg.tensorized and not tt:
        raise ConfigError(
            "compression.layers",
            f"no layer of the {cfg.model.arch!r} model "
            f"matches {list(cfg.compression.options.layers)}: nothing to compress",
        )
    layers = [_layer_plan(name, layer) for name, layer in tt]
    tt_ids = {id(p) for _, layer in tt for p in (*layer.cores, *layer.gates)}
    other = sum(p.numel() for p in model.parameters() if id(p) not in tt_ids)
    tt_params, tt_dense = sum(r["params"] for r in layers), sum(r["dense_params"] for r in layers)
    total = _total_steps(cfg, per_epoch)
    if total is None:
        warnings.append("total_steps is unknown until the worker has counted the data")
    return {
        "engine_config": cfg.to_dict(),
        "layers": layers,
        "params_before": sum(p.numel() for p in dense.parameters()),
        "params_after": other + tt_params,
        "tensorized_ratio": tt_dense / tt_params if tt_params else None,
        "estimated_memory_bytes": _memory_bytes(model, cfg, model_config),
        "total_steps": total,
        "warnings": warnings,
    }

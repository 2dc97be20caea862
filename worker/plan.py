"""The plan of a job: what the worker would build for it and what that costs, without training.

``plan_job(job)`` takes the engine job dict as prepared once
(:func:`service.store.prepare.prepare_job`; :func:`api_schemas.engine_spec.to_engine`),
validates it as the worker will (``JobConfig.from_dict``, then building the model, so a stage
or an option that does not fit the model fails here with the engine's ``ConfigError`` naming
the field), and returns per-layer shapes, modes and initial ranks, parameter counts before
and after (and those of the frozen original a pretrained ``hf`` or ``hf_bert`` model distils
from), the tensorized ratio, the memory estimate and the total number of steps when known.

Model fields the data decides (classes, input width, vocabulary, table rows) come from the
real data (:mod:`worker.data_facts`: file headers and metadata, one pass over NPZ labels, a
sample of generated data) and are checked against the bounds of ``model.config``; explicit
modes may not pad a layer more than twice per side; and with ``capacity_bytes`` the estimate
(:mod:`worker.memory_estimate`) must fit it (:mod:`worker.plan_checks`). Each refusal is a
``SpecError`` naming the field of the submitted spec, or the engine's ``ConfigError``.

The models are built on the ``meta`` device: shapes and counts without allocating weights.
Runs in the planner's child processes (``service.planner``, at submission) and in the worker
before it trains (``worker.pipeline``), never in the API process.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from api_schemas.engine_spec import SpecError
from engine.data import DataError
from engine.data.tokenizer import TOKENIZER_FILE, load_tokenizer, special_ids
from engine.export.manifest import layer_record
from engine.models.hf_bert.config import resolve_model_dir
from engine.models.registry import get_workload
from engine.nn.meta import on_meta
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank.size import tensorized_layers
from engine.train.config import ConfigError, as_config_error
from engine.train.job import JobConfig
from worker.automatic import automatic_choices
from worker.data_facts import DataFacts, data_facts
from worker.memory_estimate import estimate_memory
from worker.plan_checks import check_capacity, check_data_sizes, check_modes
from worker.process_baseline import ProcessBaseline, known_baseline

__all__ = ["plan_job"]


def _facts(cfg: JobConfig, dataset_pointer: str) -> DataFacts:
    """The data's facts; an unreadable file is a SpecError naming the dataset reference (its
    server path cut out of the message)."""
    try:
        return data_facts(cfg, dataset_pointer=dataset_pointer)
    except DataError as err:
        where = "the validation file" if err.path == cfg.data.valid else "the dataset"
        line = f" ({err.unit} {err.line})" if err.line is not None else ""
        raise SpecError(dataset_pointer, f"{where}{line}: {err.message}") from None


def _check_model_tokenizer(cfg: JobConfig) -> None:
    """``hf_bert`` without ``data.tokenizer``: the model directory's ``tokenizer.json`` must load
    and hold the special tokens, else a ``ConfigError`` on ``model.config.path`` (the submitted
    ``/model/source/...``), the file named without its server path. Loading it with the data
    (generated sentences) failed as ``/dataset`` with the absolute path in the message."""
    path = cfg.model.config.get("path")
    if cfg.model.arch != "hf_bert" or cfg.data.tokenizer is not None or not path:
        return
    try:
        file = resolve_model_dir(path) / TOKENIZER_FILE
        special_ids(load_tokenizer(file), file)
    except ConfigError as err:  # about the path itself
        raise err.under("model.config") from None
    except DataError as err:
        raise ConfigError("model.config.path", f"{TOKENIZER_FILE}: {err.message}") from None


def _layer_plan(name: str, layer: TTLinear | TTMEmbedding) -> dict[str, Any]:
    rec = layer_record(name, layer)
    if rec["kind"] == "tt_linear":
        shape = [rec["in_features"], rec["out_features"]]
        modes = {"in": rec["in_modes"], "out": rec["out_modes"]}
    else:
        shape = [rec["num_embeddings"], rec["embedding_dim"]]
        modes = {"rows": rec["row_modes"], "cols": rec["col_modes"]}
    return {
        "name": name,
        "kind": rec["kind"],
        "shape": shape,
        "modes": modes,
        "initial_ranks": rec["ranks"],
        "dense_params": rec["dense_params"],
        "params": rec["params"],
    }


PRETRAINED_ARCHS = ("hf", "hf_bert")  # with model.config.path: a frozen original as teacher


def _build(cfg: JobConfig, model_config: Any, tensorized: bool) -> nn.Module:
    workload = get_workload(cfg.model.arch)
    try:
        with on_meta():
            return workload.build(
                workload.plan_config(model_config),
                tensorized=tensorized,
                options=cfg.compression.options,
            )
    except ValueError as err:  # a stage or option that does not fit the model
        raise as_config_error(err, "compression") from None


def plan_job(
    job: dict[str, Any],
    *,
    capacity_bytes: int | None = None,
    dataset_pointer: str = "/dataset/path",
    baseline: ProcessBaseline | dict[str, int] | None = None,
) -> dict[str, Any]:
    """The plan of the engine job dict ``job``; raises ``ConfigError`` or ``SpecError`` naming
    the field. ``capacity_bytes``: the memory a worker offers a job (None: not checked);
    ``dataset_pointer``: the submitted spec's dataset reference (``/dataset/dataset_id`` for
    an upload); ``baseline``: what each process of this host holds before the job (None: the
    one the worker measured at start when this process has it, else the documented default;
    :mod:`worker.process_baseline`; a dict: its fields, as the API's planner passes it)."""
    cfg = JobConfig.from_dict(job)
    if isinstance(baseline, dict):
        baseline = ProcessBaseline.from_dict(baseline)
    baseline = baseline or known_baseline()
    _check_model_tokenizer(cfg)
    facts = _facts(cfg, dataset_pointer)
    check_data_sizes(cfg.model.arch, cfg.model.config, facts)
    model_config = cfg.model_config(facts.overrides)
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
    check_modes(layers, cfg.compression.options.modes)
    tt_ids = {id(p) for _, layer in tt for p in (*layer.cores, *layer.gates)}
    other = sum(p.numel() for p in model.parameters() if id(p) not in tt_ids)
    tt_params, tt_dense = sum(r["params"] for r in layers), sum(r["dense_params"] for r in layers)
    # a pretrained hf / hf_bert model distils from its frozen original: the dense model, held
    # beside it
    pretrained = cfg.model.arch in PRETRAINED_ARCHS and bool(cfg.model.config.get("path"))
    teacher = sum(p.numel() for p in dense.parameters()) if pretrained else 0
    auto_rank = cfg.tensorized and cfg.compression.options.max_rank == "auto"
    memory = estimate_memory(
        model,
        cfg,
        model_config,
        facts.data_bytes,
        teacher_params=teacher,
        baseline=baseline,
        train_sentences=None
        if facts.per_epoch is None
        else facts.per_epoch * cfg.training.batch_size,
        calibration=dense if auto_rank else None,
    )
    if capacity_bytes is not None:
        data_pointer = dataset_pointer if cfg.data.kind != "synthetic" else "/dataset/n_train"
        check_capacity(
            memory, capacity_bytes, model_pointer="/model/config", data_pointer=data_pointer
        )
    warnings = list(facts.warnings)
    total = cfg.total_steps(facts.per_epoch)
    if total is None:
        warnings.append("total_steps is unknown until the worker has counted the data")
    return {
        "engine_config": cfg.to_dict(),
        "layers": layers,
        "params_before": sum(p.numel() for p in dense.parameters()),
        "params_after": other + tt_params,
        "tensorized_ratio": tt_dense / tt_params if tt_params else None,
        "teacher_params": teacher or None,
        "estimated_memory_bytes": memory.total,
        "memory": memory.to_dict(),
        "memory_capacity_bytes": capacity_bytes,
        "total_steps": total,
        "automatic": automatic_choices(cfg),
        "warnings": warnings,
    }

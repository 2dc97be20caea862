"""Forward: the engine job dict of a wire spec (:func:`to_engine`), pure dictionaries and no torch.

The API uses it for the dry run and the stored engine config, the worker to build the engine's
``JobConfig`` (which validates again, against the model), ``comera run`` (``client.local``) to run
a spec without a server. Options the engine does not implement yet are refused here with the
failing field (:class:`SpecError`), never silently ignored. The way back, from an engine field
path to the wire field, is :mod:`api_schemas.wire_names`; both are re-exported by
:mod:`api_schemas.engine_spec`.

Every field not renamed (:data:`api_schemas.wire_names.RENAMES`) has the same name on both
sides. ``training.fast_path``, ``precision`` and ``cuda_graph`` pass through to the engine's
``TrainingConfig``; the combinations it refuses are refused here too, naming the field: ``bf16``
without the fast path, ``cuda_graph: on`` on a device that is not CUDA (at submission the device
is the spec's, ``auto`` counting as the CPU; the schema already asks ``on`` for ``device: cuda``)
or with ``galore`` (no capturable optimizer step).

``hf_bert``: the engine's ``model.config`` is the spec's ``model.config`` plus ``path`` (the
model directory: the resolved ``hf_dir`` under the data root, or ``pkg:<package>/model``),
``distill`` and ``distill_weight`` (from ``model.distill``). Such a job needs held-out
sentences (its fidelity is measured on them): a generated validation split or ``valid_path`` /
``valid_every``.

``hf``: the engine's ``model.config`` is the spec's ``model.config`` (``task``, ``targets``,
``tensorize_lm_head``, ``export_dense``, ...) plus the model: ``path`` (the resolved
``hf_dir``, the uploaded model's directory, ``pkg:<package>/model``) or, for a ``hf_config``
source, ``hf_config`` and ``tokenizer`` (the resolved ``tokenizer.json``); ``distill_weight`` and
``temperature`` from ``model.distill`` when given.
"""

from __future__ import annotations

from typing import Any

from api_schemas.hf_model import HFConfigSource
from api_schemas.jobs import DistillSpec, JobCreate

__all__ = [
    "ENGINE_CONFIG_VERSION",
    "SpecError",
    "hf_model_config",
    "hf_workload_config",
    "package_path",
    "to_engine",
]

ENGINE_CONFIG_VERSION = 1


class SpecError(ValueError):
    """A spec field the engine cannot honour; ``pointer`` is a JSON Pointer into the body."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.pointer = pointer
        self.message = message


def _data(spec: JobCreate, train_path: str | None, valid_path: str | None) -> dict[str, Any]:
    ds = spec.dataset
    out: dict[str, Any] = {
        "n_train": ds.n_train,
        "n_valid": ds.n_valid,
        "synthetic_seed": ds.synthetic_seed,
        "params": dict(ds.params),
        "valid_every": ds.valid_every,
        "text_a": ds.text_a,
        "text_b": ds.text_b,
        "label_field": ds.label_field,
        "vocab_size": ds.vocab_size,
        "max_len": ds.max_len,
        "num_rows": ds.num_rows,
        "length_buckets": ds.length_buckets,
    }
    if ds.source == "synthetic":
        out.update(kind="synthetic", generator=ds.generator)
    else:
        if train_path is None:
            raise SpecError("/dataset", "the dataset could not be resolved to a file")
        out.update(kind=ds.format, train=train_path, valid=valid_path)
    return out


def package_path(name: str) -> str:
    """The engine path of a packaged model (``pkg:<package>/model``)."""
    return f"pkg:{name}/model"


def hf_model_config(spec: JobCreate, model_path: str | None) -> dict[str, Any]:
    """The engine's ``model.config`` of an ``hf_bert`` spec (see the module docstring)."""
    model, ds = spec.model, spec.dataset
    source, distill = model.source, model.distill or DistillSpec()
    if distill.kind == "kl_logits":
        raise SpecError(
            "/model/distill/kind",
            "'kl_logits' is not implemented by this engine: "
            "a BERT encoder directory has no logits head (pooler and MLM weights "
            "are not used); use 'mse_hidden' (last hidden states) or "
            "'cosine_embedding' (sentence embeddings)",
        )
    if ds.format not in (None, "text"):
        raise SpecError("/dataset/format", "hf_bert reads 'text' files (one sentence a line)")
    if ds.source == "synthetic" and ds.generator not in (None, "stdlib_text"):
        raise SpecError("/dataset/generator", "hf_bert sentences come from 'stdlib_text'")
    if ds.source != "synthetic" and ds.valid_path is None and ds.valid_every < 2:
        raise SpecError(
            "/dataset/valid_path",
            "hf_bert jobs measure fidelity on held-out "
            "sentences: give valid_path or valid_every >= 2",
        )
    if source is not None and source.kind == "package":
        model_path = model_path or package_path(source.name)
    if model_path is None:
        raise SpecError("/model/source/path", "the model directory could not be resolved")
    return {
        **dict(model.config),
        "path": model_path,
        "distill": distill.kind or "cosine_embedding",
        "distill_weight": distill.weight,
    }


def hf_workload_config(spec: JobCreate, model_path: str | None) -> dict[str, Any]:
    """The engine's ``model.config`` of an ``hf`` spec (see the module docstring);
    ``model_path``: the resolved directory, or the ``tokenizer.json`` of a ``hf_config``."""
    model = spec.model
    source, out = model.source, dict(model.config)
    if model.distill is not None:
        out["distill_weight"] = model.distill.weight
        if model.distill.temperature is not None:
            out["temperature"] = model.distill.temperature
    if isinstance(source, HFConfigSource):
        if model_path is None:
            raise SpecError("/model/source/tokenizer", "the tokenizer could not be resolved")
        return {**out, "hf_config": dict(source.config), "tokenizer": model_path}
    if source is not None and source.kind == "package":
        model_path = model_path or package_path(source.name)
    if model_path is None:
        raise SpecError("/model/source", "the model directory could not be resolved")
    return {**out, "path": model_path}


def _stage(stage: Any, default_target: float | None) -> dict[str, Any]:
    out = stage.model_dump(mode="json", exclude_none=True)
    if stage.kind == "late" and stage.target_ratio is None and default_target is not None:
        out["target_ratio"] = default_target
    return out


def to_engine(
    spec: JobCreate,
    *,
    train_path: str | None = None,
    valid_path: str | None = None,
    device: str = "cpu",
    model_path: str | None = None,
) -> dict[str, Any]:
    """The engine job dict (``engine.train.JobConfig.from_dict`` input) for this spec.

    ``train_path`` / ``valid_path``: the resolved files of an uploaded or server-side dataset;
    ``device``: what ``training.device = auto`` resolved to on the worker; ``model_path``:
    the resolved model directory of an ``hf_bert`` source (``service.store.model_source``).
    """
    tr, comp = spec.training, spec.compression
    if tr.device == "cuda" and device != "cuda":
        raise SpecError("/training/device", "'cuda' was asked for but this worker has no GPU")
    if tr.precision == "bf16" and not tr.fast_path:  # also refused by TrainingSpec
        raise SpecError(
            "/training/precision",
            "bf16 runs the TT layers through the fast path: set training.fast_path to true",
        )
    if tr.cuda_graph == "on" and device != "cuda":
        raise SpecError(
            "/training/cuda_graph",
            f"'on' needs a CUDA device, this job runs on {device!r} (use 'auto' or 'off')",
        )
    if tr.cuda_graph == "on" and comp.method == "galore":
        raise SpecError(
            "/training/cuda_graph",
            "'on' needs a capturable optimizer step "
            "(AdamW: methods comera and dense); galore's GaLoreAdamW has none, "
            "use 'auto' or 'off'",
        )
    if spec.model.arch == "mlp" and spec.dataset.format not in (None, "npz"):
        raise SpecError("/dataset/format", "the mlp architecture reads 'npz' arrays")
    explicit = isinstance(comp.modes, dict)
    compression = {
        "max_rank": comp.max_rank,
        "gate_threshold": comp.gate_threshold,
        "shapes": "auto" if explicit else comp.modes,
        "layers": list(comp.layers),
        "min_size": comp.min_size,
        "penalty": comp.penalty,
        "shrink_every": comp.shrink_every,
        "max_metric_drop": comp.max_metric_drop,
        "min_rank_fraction": comp.min_rank_fraction,
    }
    if explicit:
        compression["modes"] = {p: {"in": m.in_, "out": m.out} for p, m in comp.modes.items()}
    if comp.embedding_max_rank is not None:
        compression["embedding_max_rank"] = comp.embedding_max_rank
    if comp.d is not None:
        compression["d"] = comp.d
    training = {
        "batch_size": tr.batch_size,
        "seed": tr.seed,
        "device": device,
        "weight_decay": tr.weight_decay,
        "log_every": tr.log_every,
        "fast_path": tr.fast_path,
        "precision": tr.precision,
        "cuda_graph": tr.cuda_graph,
        "devices": tr.devices,
        "nodes": tr.nodes,
    }
    if tr.grad_clip is not None:
        training["grad_clip"] = tr.grad_clip
    if tr.eval_batches is not None:
        training["eval_batches"] = tr.eval_batches
    model_config = dict(spec.model.config)
    if spec.model.arch == "hf_bert":
        model_config = hf_model_config(spec, model_path)
    elif spec.model.arch == "hf":
        model_config = hf_workload_config(spec, model_path)
    checkpoint: dict[str, Any] = {"keep": spec.checkpointing.keep}
    if spec.checkpointing.every_n_steps is not None:
        checkpoint["every_steps"] = spec.checkpointing.every_n_steps
    return {
        "version": ENGINE_CONFIG_VERSION,
        "name": spec.name,
        "method": comp.method,
        "model": {"arch": spec.model.arch, "config": model_config},
        "data": _data(spec, train_path, valid_path),
        "compression": compression,
        "schedule": [_stage(s, comp.target_ratio) for s in spec.schedule],
        "training": training,
        "checkpoint": checkpoint,
    }

"""From the wire spec (``JobCreate``) to the engine's job config dict, and the spec hash.

Pure dictionaries, no torch: the API uses this for the dry run and the stored engine config,
the worker to build the engine's ``JobConfig`` (which validates again, against the model).
Options the engine does not implement yet are refused here with the failing field, never
silently ignored.

``training.fast_path``, ``precision`` and ``cuda_graph`` pass through to the engine's
``TrainingConfig``; the combinations it refuses are refused here too, naming the field:
``bf16`` without the fast path, ``cuda_graph: on`` on a device that is not CUDA (at submission
the device is the spec's, ``auto`` counting as the CPU; the schema already asks ``on`` for
``device: cuda``) or with ``galore`` (no capturable optimizer step).

``hf_bert``: the engine's ``model.config`` is the spec's ``model.config`` plus ``path`` (the
model directory: the resolved ``hf_dir`` under the data root, see
:mod:`service.model_source`, or ``pkg:<package>/model``), ``distill`` and
``distill_weight`` (from ``model.distill``). Such a job needs held-out sentences (its
fidelity is measured on them): a generated validation split or ``valid_path`` /
``valid_every``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from api_schemas import JobCreate
from api_schemas.jobs import DistillSpec

__all__ = ["SpecError", "canonical_json", "hf_model_config", "package_path", "spec_hash",
           "to_engine"]  # fmt: skip

ENGINE_CONFIG_VERSION = 1


class SpecError(ValueError):
    """A spec field the engine cannot honour; ``pointer`` is a JSON Pointer into the body."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.pointer = pointer
        self.message = message


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def spec_hash(spec: JobCreate) -> str:
    """sha256 of the normalized spec (defaults filled), so equal jobs hash equal."""
    return hashlib.sha256(canonical_json(spec.model_dump(mode="json"))).hexdigest()


def _data(spec: JobCreate, train_path: str | None, valid_path: str | None) -> dict[str, Any]:
    ds = spec.dataset
    out: dict[str, Any] = {"n_train": ds.n_train, "n_valid": ds.n_valid,
                           "synthetic_seed": ds.synthetic_seed, "params": dict(ds.params),
                           "valid_every": ds.valid_every, "text_a": ds.text_a,
                           "text_b": ds.text_b, "label_field": ds.label_field,
                           "vocab_size": ds.vocab_size, "max_len": ds.max_len,
                           "num_rows": ds.num_rows,
                           "length_buckets": ds.length_buckets}  # fmt: skip
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
        raise SpecError("/model/distill/kind", "'kl_logits' is not implemented by this engine: "
                        "a BERT encoder directory has no logits head (pooler and MLM weights "
                        "are not used); use 'mse_hidden' (last hidden states) or "
                        "'cosine_embedding' (sentence embeddings)")  # fmt: skip
    if ds.format not in (None, "text"):
        raise SpecError("/dataset/format", "hf_bert reads 'text' files (one sentence a line)")
    if ds.source == "synthetic" and ds.generator not in (None, "stdlib_text"):
        raise SpecError("/dataset/generator", "hf_bert sentences come from 'stdlib_text'")
    if ds.source != "synthetic" and ds.valid_path is None and ds.valid_every < 2:
        raise SpecError("/dataset/valid_path", "hf_bert jobs measure fidelity on held-out "
                        "sentences: give valid_path or valid_every >= 2")  # fmt: skip
    if source is not None and source.kind == "package":
        model_path = model_path or package_path(source.name)
    if model_path is None:
        raise SpecError("/model/source/path", "the model directory could not be resolved")
    return {**dict(model.config), "path": model_path, "distill": distill.kind,
            "distill_weight": distill.weight}  # fmt: skip


def _stage(stage: Any, default_target: float | None) -> dict[str, Any]:
    out = stage.model_dump(mode="json", exclude_none=True)
    if stage.kind == "late" and stage.target_ratio is None and default_target is not None:
        out["target_ratio"] = default_target
    return out


def to_engine(spec: JobCreate, *, train_path: str | None = None, valid_path: str | None = None,
              device: str = "cpu", model_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The engine job dict (``engine.train.JobConfig.from_dict`` input) for this spec.

    ``train_path`` / ``valid_path``: the resolved files of an uploaded or server-side dataset;
    ``device``: what ``training.device = auto`` resolved to on the worker; ``model_path``:
    the resolved model directory of an ``hf_bert`` source (``service.model_source``).
    """
    tr, comp = spec.training, spec.compression
    if tr.device == "cuda" and device != "cuda":
        raise SpecError("/training/device", "'cuda' was asked for but this worker has no GPU")
    if tr.precision == "bf16" and not tr.fast_path:  # also refused by TrainingSpec
        raise SpecError("/training/precision", "bf16 runs the TT layers through the fast "
                        "path: set training.fast_path to true")  # fmt: skip
    if tr.cuda_graph == "on" and device != "cuda":
        raise SpecError("/training/cuda_graph", f"'on' needs a CUDA device, this job runs on "
                        f"{device!r} (use 'auto' or 'off')")  # fmt: skip
    if tr.cuda_graph == "on" and comp.method == "galore":
        raise SpecError("/training/cuda_graph", "'on' needs a capturable optimizer step "
                        "(AdamW: methods comera and dense); galore's GaLoreAdamW has none, "
                        "use 'auto' or 'off'")  # fmt: skip
    if spec.model.arch == "mlp" and spec.dataset.format not in (None, "npz"):
        raise SpecError("/dataset/format", "the mlp architecture reads 'npz' arrays")
    explicit = isinstance(comp.modes, dict)
    compression = {"max_rank": comp.max_rank, "gate_threshold": comp.gate_threshold,
                   "shapes": "auto" if explicit else comp.modes, "layers": list(comp.layers),
                   "min_size": comp.min_size, "penalty": comp.penalty,
                   "shrink_every": comp.shrink_every}  # fmt: skip
    if explicit:
        compression["modes"] = {p: {"in": m.in_, "out": m.out} for p, m in comp.modes.items()}
    if comp.embedding_max_rank is not None:
        compression["embedding_max_rank"] = comp.embedding_max_rank
    if comp.d is not None:
        compression["d"] = comp.d
    training = {"batch_size": tr.batch_size, "seed": tr.seed, "device": device,
                "weight_decay": tr.weight_decay, "log_every": tr.log_every,
                "fast_path": tr.fast_path, "precision": tr.precision,
                "cuda_graph": tr.cuda_graph}  # fmt: skip
    if tr.grad_clip is not None:
        training["grad_clip"] = tr.grad_clip
    if tr.eval_batches is not None:
        training["eval_batches"] = tr.eval_batches
    model_config = dict(spec.model.config)
    if spec.model.arch == "hf_bert":
        model_config = hf_model_config(spec, model_path)
    checkpoint: dict[str, Any] = {"keep": spec.checkpointing.keep}
    if spec.checkpointing.every_n_steps is not None:
        checkpoint["every_steps"] = spec.checkpointing.every_n_steps
    return {
        "version": ENGINE_CONFIG_VERSION, "name": spec.name, "method": comp.method,
        "model": {"arch": spec.model.arch, "config": model_config},
        "data": _data(spec, train_path, valid_path), "compression": compression,
        "schedule": [_stage(s, comp.target_ratio) for s in spec.schedule],
        "training": training, "checkpoint": checkpoint,
    }  # fmt: skip

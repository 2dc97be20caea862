"""From the wire spec (``JobCreate``) to the engine's job config dict, and the spec hash.

Pure dictionaries, no torch: the API uses this for the dry run and the stored engine config,
the worker to build the engine's ``JobConfig`` (which validates again, against the model).
Options the engine does not implement yet are refused here with the failing field, never
silently ignored.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from api_schemas import JobCreate

__all__ = ["SpecError", "canonical_json", "spec_hash", "to_engine"]

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
                           "num_rows": ds.num_rows}  # fmt: skip
    if ds.source == "synthetic":
        out.update(kind="synthetic", generator=ds.generator)
    else:
        if train_path is None:
            raise SpecError("/dataset", "the dataset could not be resolved to a file")
        out.update(kind=ds.format, train=train_path, valid=valid_path)
    return out


def _stage(stage: Any, default_target: float | None) -> dict[str, Any]:
    out = stage.model_dump(mode="json", exclude_none=True)
    if stage.kind == "late" and stage.target_ratio is None and default_target is not None:
        out["target_ratio"] = default_target
    return out


def to_engine(spec: JobCreate, *, train_path: str | None = None, valid_path: str | None = None,
              device: str = "cpu") -> dict[str, Any]:  # fmt: skip
    """The engine job dict (``engine.train.JobConfig.from_dict`` input) for this spec.

    ``train_path`` / ``valid_path``: the resolved files of an uploaded or server-side dataset;
    ``device``: what ``training.device = auto`` resolved to on the worker.
    """
    tr, comp = spec.training, spec.compression
    if tr.precision != "fp32":
        raise SpecError("/training/precision", "only 'fp32' is implemented by this engine")
    if tr.cuda_graph == "on":
        raise SpecError("/training/cuda_graph", "CUDA graphs are not implemented by this "
                        "engine yet; use 'auto' or 'off'")  # fmt: skip
    if tr.device == "cuda" and device != "cuda":
        raise SpecError("/training/device", "'cuda' was asked for but this worker has no GPU")
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
                "weight_decay": tr.weight_decay, "log_every": tr.log_every}  # fmt: skip
    if tr.grad_clip is not None:
        training["grad_clip"] = tr.grad_clip
    if tr.eval_batches is not None:
        training["eval_batches"] = tr.eval_batches
    checkpoint: dict[str, Any] = {"keep": spec.checkpointing.keep}
    if spec.checkpointing.every_n_steps is not None:
        checkpoint["every_steps"] = spec.checkpointing.every_n_steps
    return {
        "version": ENGINE_CONFIG_VERSION, "name": spec.name, "method": comp.method,
        "model": {"arch": spec.model.arch, "config": dict(spec.model.config)},
        "data": _data(spec, train_path, valid_path), "compression": compression,
        "schedule": [_stage(s, comp.target_ratio) for s in spec.schedule],
        "training": training, "checkpoint": checkpoint,
    }  # fmt: skip

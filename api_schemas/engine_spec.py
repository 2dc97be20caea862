"""The one translation between the wire spec (``JobCreate``) and the engine's job config, both ways.

Forward, :func:`to_engine`: the engine job dict (``engine.train.JobConfig.from_dict`` input) of
a spec, pure dictionaries and no torch. The API uses it for the dry run and the stored engine
config, the worker to build the engine's ``JobConfig`` (which validates again, against the
model), ``comera run`` (``client.local``) to run a spec without a server. Options the engine
does not implement yet are refused here with the failing field (:class:`SpecError`), never
silently ignored.

Backward, :func:`engine_pointer`: the JSON Pointer into the submitted body of an engine field
path (``ConfigError.field``, ``schedule[1].target_ratio``), so the planner's 422 and a failed
job's problem name the same wire field for the same engine error. The rule, in order:

1. the longest prefix of the engine path that :data:`RENAMES` lists (and whose condition on
   the submitted spec holds, the first such entry in table order) is replaced by its wire
   pointer; the rest of the path follows unchanged (list indices included);
2. a field the wire does not have (one that only exists in the engine, such as
   ``data.shuffle_buffer``, ``galore.rank`` or ``version``) points at its nearest ancestor that
   the wire has, and with none at the whole body (``""``).

Every field not in :data:`RENAMES` has the same name on both sides. ``training.fast_path``,
``precision`` and ``cuda_graph`` pass through to the engine's ``TrainingConfig``; the
combinations it refuses are refused here too, naming the field: ``bf16`` without the fast path,
``cuda_graph: on`` on a device that is not CUDA (at submission the device is the spec's,
``auto`` counting as the CPU; the schema already asks ``on`` for ``device: cuda``) or with
``galore`` (no capturable optimizer step).

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

import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel

from api_schemas.hf_model import HFConfigSource
from api_schemas.jobs import DistillSpec, JobCreate

__all__ = [
    "ENGINE_CONFIG_VERSION",
    "RENAMES",
    "Rename",
    "Spec",
    "SpecError",
    "engine_pointer",
    "hf_model_config",
    "hf_workload_config",
    "json_pointer",
    "package_path",
    "rename_of",
    "to_engine",
    "wire_has",
    "wire_path",
]

ENGINE_CONFIG_VERSION = 1
Spec = JobCreate | Mapping[str, Any] | None


class SpecError(ValueError):
    """A spec field the engine cannot honour; ``pointer`` is a JSON Pointer into the body."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.pointer = pointer
        self.message = message


# -- forward ----------------------------------------------------------------------------------
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


# -- backward ---------------------------------------------------------------------------------
Part = str | int


def _get(spec: Mapping[str, Any], *path: Part) -> Any:
    cur: Any = spec
    for p in path:
        if isinstance(p, int):
            cur = cur[p] if isinstance(cur, list | tuple) and 0 <= p < len(cur) else None
        else:
            cur = cur.get(p) if isinstance(cur, Mapping) else None
    return cur


def _stage_target_from_compression(spec: Mapping[str, Any], index: tuple[int, ...]) -> bool:
    """The stage's ``target_ratio`` was the default ``compression.target_ratio`` (a late stage
    that gave none)."""
    stage = _get(spec, "schedule", index[0]) if index else None
    return (
        isinstance(stage, Mapping)
        and stage.get("kind") == "late"
        and stage.get("target_ratio") is None
        and _get(spec, "compression", "target_ratio") is not None
    )


CONDITIONS: dict[str, Callable[[Mapping[str, Any], tuple[int, ...]], bool]] = {
    "": lambda spec, index: True,
    "uploaded dataset": lambda spec, index: _get(spec, "dataset", "source") == "upload",
    "synthetic dataset": lambda spec, index: _get(spec, "dataset", "source") == "synthetic",
    "hf_bert": lambda spec, index: _get(spec, "model", "arch") == "hf_bert",
    "hf_bert package": lambda spec, index: (
        _get(spec, "model", "arch") == "hf_bert"
        and _get(spec, "model", "source", "kind") == "package"
    ),
    "default target": _stage_target_from_compression,
    "hf": lambda spec, index: _get(spec, "model", "arch") == "hf",
    "hf source": lambda spec, index: (
        _get(spec, "model", "arch") == "hf" and _get(spec, "model", "source", "kind") == "hf_dir"
    ),
    "hf uploaded": lambda spec, index: (
        _get(spec, "model", "arch") == "hf" and _get(spec, "model", "source", "kind") == "uploaded"
    ),
    "hf package": lambda spec, index: (
        _get(spec, "model", "arch") == "hf" and _get(spec, "model", "source", "kind") == "package"
    ),
}


@dataclass(frozen=True)
class Rename:
    """An engine field whose wire name differs: ``engine`` is a dotted path (``[*]`` for any
    list index), ``wire`` a JSON Pointer (``{0}`` for the index ``[*]`` matched); ``when`` names
    a condition on the submitted spec (:data:`CONDITIONS`; ``""``: always)."""

    engine: str
    wire: str
    when: str = ""


# Every engine field whose wire name differs, with the wire field it comes from (to_engine's
# name map, read backwards). Entries of one engine field are tried in order.
RENAMES: tuple[Rename, ...] = (
    Rename("method", "/compression/method"),
    Rename("data", "/dataset"),
    Rename("data.kind", "/dataset/source", "synthetic dataset"),
    Rename("data.kind", "/dataset/format"),
    Rename("data.train", "/dataset/dataset_id", "uploaded dataset"),
    Rename("data.train", "/dataset/path"),
    Rename("data.valid", "/dataset/dataset_id", "uploaded dataset"),
    Rename("data.valid", "/dataset/valid_path"),
    Rename("compression.shapes", "/compression/modes"),
    Rename("schedule[*].target_ratio", "/compression/target_ratio", "default target"),
    Rename("checkpoint", "/checkpointing"),
    Rename("checkpoint.every_steps", "/checkpointing/every_n_steps"),
    Rename("model.config.path", "/model/source/name", "hf_bert package"),
    Rename("model.config.path", "/model/source/path", "hf_bert"),
    Rename("model.config.distill", "/model/distill/kind", "hf_bert"),
    Rename("model.config.distill_weight", "/model/distill/weight", "hf_bert"),
    # read from the model directory's config.json, never given in model.config
    Rename("model.config.architecture", "/model/source", "hf_bert"),
    Rename("model.config.path", "/model/source/name", "hf package"),
    Rename("model.config.path", "/model/source/id", "hf uploaded"),
    Rename("model.config.path", "/model/source/path", "hf source"),
    Rename("model.config.hf_config", "/model/source/config", "hf"),
    Rename("model.config.tokenizer", "/model/source/tokenizer", "hf"),
    Rename("model.config.distill_weight", "/model/distill/weight", "hf"),
    Rename("model.config.temperature", "/model/distill/temperature", "hf"),
    Rename("model.config.max_len", "/dataset/max_len", "hf"),
    # read from the model's tokenizer, never given in model.config
    Rename("model.config.tokenizer_vocab_size", "/model/source", "hf"),
    Rename("model.config.pad_token_id", "/model/source", "hf"),
    Rename("model.config.mask_token_id", "/model/source", "hf"),
)


def _split(field: str) -> list[Part]:
    """``schedule[1].lr.cores`` -> ``["schedule", 1, "lr", "cores"]``."""
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", field)]


_PATTERNS = [(r, _split(r.engine)) for r in RENAMES]


def _match(pattern: list[Part], parts: list[Part]) -> tuple[int, ...] | None:
    """The list indices ``pattern`` matched at the start of ``parts``, or None."""
    if len(parts) < len(pattern):
        return None
    index = []
    for want, got in zip(pattern, parts, strict=False):
        if want == "*" and isinstance(got, int):
            index.append(got)
        elif want != got:
            return None
    return tuple(index)


def _wire_parts(pointer: str, index: tuple[int, ...]) -> list[Part]:
    parts: list[Part] = []
    for p in pointer.split("/")[1:]:
        p = p.format(*index)
        parts.append(int(p) if p.isdigit() else p)
    return parts


def _as_mapping(spec: Spec) -> Mapping[str, Any]:
    if spec is None:
        return {}
    if isinstance(spec, JobCreate):
        return spec.model_dump(mode="json")
    return spec


def _find(parts: list[Part], spec: Mapping[str, Any]) -> tuple[Rename, tuple[int, ...], int] | None:
    """The entry naming ``parts`` (rule 1), the indices it matched and its length."""
    for length in range(len(parts), 0, -1):
        for rename, pattern in _PATTERNS:
            if len(pattern) != length:
                continue
            index = _match(pattern, parts)
            if index is not None and CONDITIONS[rename.when](spec, index):
                return rename, index, length
    return None


def rename_of(field: str, spec: Spec = None) -> Rename | None:
    """The entry of :data:`RENAMES` that names the engine field ``field`` for ``spec`` (the
    longest matching prefix whose condition holds), or None: the same name on the wire."""
    found = _find(_split(field), _as_mapping(spec))
    return None if found is None else found[0]


def _renamed(parts: list[Part], spec: Mapping[str, Any]) -> list[Part]:
    found = _find(parts, spec)
    if found is None:
        return parts
    rename, index, length = found
    return _wire_parts(rename.wire, index) + parts[length:]


def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of a field's type, ``Annotated`` and unions taken apart."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def _child(annotation: Any, part: Part) -> Any | None:
    """The type of ``part`` inside a value of type ``annotation``; None if it has none."""
    for alt in _unwrap(annotation):
        origin = typing.get_origin(alt)
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            for name, info in alt.model_fields.items():
                if part in (name, info.alias):
                    return info.annotation
        elif origin in (list, tuple) and isinstance(part, int):
            return typing.get_args(alt)[0]
        elif origin is dict:
            return typing.get_args(alt)[1]
    return None


def wire_has(parts: list[Part]) -> bool:
    """Whether the wire schema (``JobCreate``) has a field at ``parts`` (any key of a mapping
    field such as ``model.config``, any index of a list)."""
    annotation: Any = JobCreate
    for part in parts:
        annotation = _child(annotation, part)
        if annotation is None:
            return False
    return True


def json_pointer(parts: list[Part]) -> str:
    """RFC 6901: ``["schedule", 1, "a/b"]`` -> ``/schedule/1/a~1b``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def wire_path(field: str, spec: Spec = None) -> list[Part] | None:
    """The wire field (as path parts) the engine field ``field`` is read from, or None when the
    wire has no such field (one that only exists in the engine)."""
    parts = _renamed(_split(field), _as_mapping(spec))
    return parts if wire_has(parts) else None


def engine_pointer(field: str | None, spec: Spec = None) -> str:
    """The JSON Pointer into the submitted body of the engine field path ``field`` (the rule is
    in the module docstring); ``spec`` is the submitted spec (a ``JobCreate`` or its JSON),
    which decides the conditional names (an upload's ``data.train`` is ``/dataset/dataset_id``).
    ``None`` or ``""``: the whole body."""
    parts = _renamed(_split(field or ""), _as_mapping(spec))
    while parts and not wire_has(parts):
        parts = parts[:-1]
    return json_pointer(parts)

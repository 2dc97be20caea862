"""Backward: the JSON Pointer into the submitted body of an engine field path
(:func:`engine_pointer`), so the planner's 422 and a failed job's problem name the same wire
field for the same engine error.

The engine names a field by its path in its job config (``ConfigError.field``,
``schedule[1].target_ratio``); the forward translation is :mod:`api_schemas.spec_to_engine`.
The rule, in order:

1. the longest prefix of the engine path that :data:`RENAMES` lists (and whose condition on
   the submitted spec holds, the first such entry in table order) is replaced by its wire
   pointer; the rest of the path follows unchanged (list indices included);
2. a field the wire does not have (one that only exists in the engine, such as
   ``data.shuffle_buffer``, ``galore.rank`` or ``version``) points at its nearest ancestor that
   the wire has, and with none at the whole body (``""``).

Every field not in :data:`RENAMES` has the same name on both sides.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel

from api_schemas.jobs import JobCreate

__all__ = [
    "RENAMES",
    "Rename",
    "Spec",
    "engine_pointer",
    "json_pointer",
    "rename_of",
    "wire_has",
    "wire_path",
]

Spec = JobCreate | Mapping[str, Any] | None
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

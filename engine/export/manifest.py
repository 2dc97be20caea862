"""The JSON manifest of a compressed checkpoint: what was saved, its sizes and how to rebuild it.

A checkpoint directory holds ``model.safetensors`` (tensors only) and ``manifest.json``::

    {"format": "comera-compressed", "format_version": 1, "engine_version": "0.1.0",
     "arch": "transformer", "model_config": {...}, "options": {...}, "tensorized": true,
     "dtype": "float32",                      # parameter dtype of the exported model
     "layers": [{"name": "encoder.0.attn.q", "kind": "tt_linear", "in_modes": [...],
                 "out_modes": [...], "ranks": [1, 5, 3, 1], "params": 412,
                 "dense_params": 1024, "ratio": 2.49, ...}, ...],
     "totals": {...}, "weights": {"file": "model.safetensors", "bytes": ..., "sha256": ...},
     "metrics": {...}, "extra": {...}}

Counts (``totals``): ``stored_params`` is every entry in the weights file; ``tt_params`` the
TT / TTM core entries; ``tt_dense_params`` the dense weight entries those layers stand for;
``dense_equivalent_params = stored_params - tt_params + tt_dense_params`` is the size of the
same model with every tensorized layer dense (gates are never stored, so never counted).
``tensorized_ratio = tt_dense_params / tt_params`` and ``model_ratio = dense_equivalent_params
/ stored_params``. The measured ratio (docs/method.md#export) is ``weights.file_ratio``: the
dense model's bytes (same element sizes) over the bytes of the saved file, header included. A
ratio whose denominator is 0 (a chain cut to rank 0) is written as ``null``: JSON has no
infinity.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.tt.cores import chain_numel

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "WEIGHTS_FILE",
    "MANIFEST_FILE",
    "CheckpointError",
    "layer_record",
    "tt_modules",
    "core_key",
    "gate_keys",
    "json_safe",
    "ratio",
    "dtype_name",
    "parse_dtype",
    "validate_manifest",
    "read_manifest",
]

FORMAT = "comera-compressed"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
REQUIRED_KEYS = ("arch", "model_config", "options", "tensorized", "dtype", "layers", "weights")
DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: bad manifest, corrupted or mismatching weights."""


# -- small helpers --------------------------------------------------------------------------
def ratio(num: int, den: int) -> float | None:
    """``num / den``, or ``None`` (JSON ``null``) when ``den`` is 0."""
    return None if den == 0 else num / den


def dtype_name(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype}")


def parse_dtype(name: object, field: str) -> torch.dtype:
    if not isinstance(name, str) or name not in DTYPES:
        raise CheckpointError(
            f"manifest.json: {field} must be one of {sorted(DTYPES)}, got {name!r}"
        )
    return DTYPES[name]


def json_safe(value: Any, field: str) -> Any:
    """A JSON-ready copy of ``value``: 0-d tensors and numpy scalars become numbers,
    tuples become lists, non-finite floats become ``None``; other types raise naming ``field``.
    """
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # 0-d torch tensor or numpy scalar
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{field} keys must be strings, got {k!r}")
            out[k] = json_safe(v, f"{field}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [json_safe(v, f"{field}[{i}]") for i, v in enumerate(value)]
    raise ValueError(
        f"{field} must hold only JSON values (numbers, strings, lists, dicts), "
        f"got {type(value).__name__}"
    )


# -- tensorized layers ----------------------------------------------------------------------
def tt_modules(model: nn.Module) -> dict[str, TTLinear | TTMEmbedding]:
    """Every ``TTLinear`` / ``TTMEmbedding`` by module name (first name of a shared module)."""
    out: dict[str, TTLinear | TTMEmbedding] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, TTLinear | TTMEmbedding):
            out[name] = mod
    return out


def core_key(layer: str, k: int) -> str:
    """State-dict key of core ``k`` of the layer called ``layer`` (``""``: the root)."""
    return f"{layer}.cores.{k}" if layer else f"cores.{k}"


def gate_keys(model: nn.Module) -> set[str]:
    """State-dict keys of every rank gate (never stored: the loader recreates them at 1)."""
    keys = set()
    for name, mod in model.named_modules(remove_duplicate=False):
        if not isinstance(mod, TTLinear | TTMEmbedding):
            continue
        keys.update(f"{name}.gates.{i}" if name else f"gates.{i}" for i in range(len(mod.gates)))
    return keys


def layer_record(
    name: str, mod: TTLinear | TTMEmbedding, ranks: Sequence[int] | None = None
) -> dict[str, Any]:
    """The manifest entry of one tensorized layer at ``ranks`` (default: its stored ranks)."""
    ranks = [int(r) for r in (mod.ranks if ranks is None else ranks)]
    if isinstance(mod, TTLinear):
        sizes = list(mod.mode_sizes)
    else:
        sizes = [n * m for n, m in zip(mod.row_modes, mod.col_modes, strict=True)]
    params, dense = chain_numel(sizes, ranks), mod.dense_parameters()
    common = {
        "ranks": ranks,
        "params": params,
        "dense_params": dense,
        "ratio": ratio(dense, params),
        "gate_threshold": mod.gate_threshold,
    }
    if isinstance(mod, TTLinear):
        return {
            "name": name,
            "kind": "tt_linear",
            "in_features": mod.in_features,
            "out_features": mod.out_features,
            "bias": mod.bias is not None,
            "in_modes": list(mod.in_modes),
            "out_modes": list(mod.out_modes),
            **common,
        }
    return {
        "name": name,
        "kind": "ttm_embedding",
        "num_embeddings": mod.num_embeddings,
        "embedding_dim": mod.embedding_dim,
        "padding_idx": mod.padding_idx,
        "row_modes": list(mod.row_modes),
        "col_modes": list(mod.col_modes),
        **common,
    }


# -- reading --------------------------------------------------------------------------------
def _check_layer(i: int, rec: object) -> None:
    where = f"manifest.json: layers[{i}]"
    if not isinstance(rec, Mapping):
        raise CheckpointError(f"{where} must be an object, got {type(rec).__name__}")
    kind = rec.get("kind")
    if kind not in ("tt_linear", "ttm_embedding"):
        raise CheckpointError(f"{where}.kind must be 'tt_linear' or 'ttm_embedding', got {kind!r}")
    modes = ("in_modes", "out_modes") if kind == "tt_linear" else ("row_modes", "col_modes")
    if not isinstance(rec.get("name"), str):
        raise CheckpointError(f"{where}.name must be a string, got {rec.get('name')!r}")
    for key in ("ranks", *modes):
        v = rec.get(key)
        if not isinstance(v, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
        ):
            raise CheckpointError(f"{where}.{key} must be a list of integers >= 0, got {v!r}")
    n_cores = len(rec[modes[0]]) + (len(rec[modes[1]]) if kind == "tt_linear" else 0)
    if len(rec["ranks"]) != n_cores + 1:
        raise CheckpointError(
            f"{where}.ranks must have {n_cores + 1} entries for {n_cores} cores, got {rec['ranks']}"
        )


def validate_manifest(data: object) -> dict[str, Any]:
    """Check format name and version, required keys and layer records; return the dict."""
    if not isinstance(data, dict):
        raise CheckpointError(f"manifest.json must hold a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise CheckpointError(
            f"manifest.json: format must be {FORMAT!r}, got {data.get('format')!r}"
        )
    version = data.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(
            f"manifest.json: format_version {version!r} is not supported "
            f"(this engine reads version {FORMAT_VERSION})"
        )
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise CheckpointError(f"manifest.json: missing keys {missing}")
    if not isinstance(data["arch"], str):
        raise CheckpointError(f"manifest.json: arch must be a string, got {data['arch']!r}")
    for key in ("model_config", "options", "weights"):
        if not isinstance(data[key], dict):
            raise CheckpointError(f"manifest.json: {key} must be an object, got {data[key]!r}")
    if not isinstance(data["tensorized"], bool):
        raise CheckpointError(
            f"manifest.json: tensorized must be true or false, got {data['tensorized']!r}"
        )
    parse_dtype(data["dtype"], "dtype")
    if not isinstance(data["layers"], list):
        raise CheckpointError(f"manifest.json: layers must be a list, got {data['layers']!r}")
    for i, rec in enumerate(data["layers"]):
        _check_layer(i, rec)
    weights = data["weights"]
    if not isinstance(weights.get("sha256"), str) or len(weights["sha256"]) != 64:
        raise CheckpointError(
            f"manifest.json: weights.sha256 must be a 64-digit hex string, "
            f"got {weights.get('sha256')!r}"
        )
    if weights.get("file") != WEIGHTS_FILE:
        raise CheckpointError(
            f"manifest.json: weights.file must be {WEIGHTS_FILE!r}, got {weights.get('file')!r}"
        )
    return data


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read and validate ``manifest.json`` from a checkpoint directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {MANIFEST_FILE} at {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"manifest.json: not valid JSON ({exc})") from None
    return validate_manifest(data)

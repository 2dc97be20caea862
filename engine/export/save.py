"""``export_compressed``: write a trained model as shrunk cores plus a JSON manifest.

The live model is never touched. For every ``TTLinear`` / ``TTMEmbedding`` the cores and gates
are copied and run through the same surgery as training (:mod:`engine.tt.surgery`): first
``shrink_chain_`` slices the dead bond entries out (gate ``<= tau``), then
``fold_gates_chain_`` multiplies the surviving ``mu(g_k)`` into core ``k`` and leaves every gate
at 1, so the stored cores alone give the layer's output and the gates are not written (the
loader recreates them as ones at the stored ranks). Every other state-dict tensor is written as
it is. Floating tensors may be cast to ``dtype`` (``torch.bfloat16`` halves the file).

The weights file is byte-identical for identical tensors (its header in one canonical order,
:func:`_canonical`), so an export's sha256 can be checked against a known-good digest.

Both files are written atomically (temporary file in the same directory, ``fsync``,
``os.replace``): weights first, then the manifest that carries their byte size and sha256, so
a manifest never names a weights file it did not see complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn

from engine.export.manifest import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    core_key,
    dtype_name,
    gate_keys,
    json_safe,
    layer_record,
    ratio,
)
from engine.models.registry import TensorizeOptions, get_workload
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.tt.surgery import fold_gates_chain_, shrink_chain_
from engine.version import __version__

__all__ = ["ExportInfo", "export_compressed", "atomic_write"]


@dataclass(frozen=True)
class ExportInfo:
    """Where an export went and what it wrote."""

    path: Path  # the checkpoint directory
    weights_path: Path
    manifest_path: Path
    file_bytes: int  # size of model.safetensors
    sha256: str  # of model.safetensors
    manifest: dict[str, Any]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary sibling, ``fsync`` and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename durable; not every platform can open a directory
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# -- what is stored -------------------------------------------------------------------------
def _source_dtype(model: nn.Module) -> torch.dtype:
    """The one floating dtype of the model's parameters (float32 when it has none)."""
    found = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(found) > 1:
        raise ValueError(
            f"model parameters must share one floating dtype to export, "
            f"got {sorted(str(d) for d in found)}"
        )
    return found.pop() if found else torch.float32


@torch.no_grad()
def _shrunk_cores(
    model: nn.Module,
) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
    """Folded, shrunk cores of every TT / TTM layer by state-dict key, and their records.

    A module reachable under several names is processed once, recorded under its first name
    and its cores are stored under every name (as ``state_dict`` lists them).
    """
    cores_by_key: dict[str, Tensor] = {}
    records = []
    done: dict[int, list[Tensor]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        if not isinstance(mod, TTLinear | TTMEmbedding):
            continue
        if id(mod) not in done:
            cores = [nn.Parameter(c.detach().clone(), requires_grad=False) for c in mod.cores]
            gates = [nn.Parameter(g.detach().clone(), requires_grad=False) for g in mod.gates]
            shrink_chain_(cores, gates, mod.gate_threshold)  # dead entries sliced out
            fold_gates_chain_(cores, gates, mod.gate_threshold)  # mu(g) into cores, gates -> 1
            done[id(mod)] = [c.data for c in cores]
            records.append(layer_record(name, mod, (*(int(c.shape[0]) for c in cores), 1)))
        for k, c in enumerate(done[id(mod)]):
            cores_by_key[core_key(name, k)] = c
    return cores_by_key, records


def _to_storage(t: Tensor, dtype: torch.dtype | None, seen: set[int]) -> Tensor:
    """A CPU, contiguous tensor that owns its storage (safetensors refuses shared memory)."""
    t = t.detach()
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    t = t.to("cpu").contiguous()
    storage = t.untyped_storage()
    if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
        t = t.clone()
    seen.add(t.untyped_storage().data_ptr())
    return t


def _stored_tensors(
    model: nn.Module, cores_by_key: Mapping[str, Tensor], dtype: torch.dtype | None
) -> dict[str, Tensor]:
    skip = gate_keys(model)
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for key, t in model.state_dict(keep_vars=True).items():
        if key in skip:
            continue
        out[key] = _to_storage(cores_by_key.get(key, t), dtype, seen)
    return out


# -- the manifest ---------------------------------------------------------------------------
def _normalized(arch: str, model_config: Any, options: Any) -> tuple[dict, dict]:
    """Validate config and options now (a checkpoint that cannot be rebuilt is useless)."""
    workload = get_workload(arch)
    if hasattr(model_config, "to_dict"):
        model_config = model_config.to_dict()
    if not isinstance(model_config, Mapping):
        raise ValueError(f"model_config must be a dict, got {type(model_config).__name__}")
    cfg = workload.config_from_dict(dict(model_config))
    config_dict = workload.manifest_config(cfg) if hasattr(cfg, "to_dict") else dict(model_config)
    if options is None:
        options = TensorizeOptions()
    if not isinstance(options, TensorizeOptions):
        if not isinstance(options, Mapping):
            raise ValueError(f"options must be a dict, got {type(options).__name__}")
        options = TensorizeOptions.from_dict(options)
    return json_safe(config_dict, "model_config"), json_safe(options.to_dict(), "options")


def _canonical(blob: bytes) -> bytes:
    """The safetensors file ``blob`` with its header in one order: ``__metadata__`` first, its
    keys sorted, then the tensors in offset order (as written).

    safetensors keeps the metadata in a hash map, so one model saved twice got two headers
    (and two sha256s); with this, the same tensors always give the same bytes. The header is
    re-padded with spaces to a multiple of 8 bytes, as the format asks."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
    ordered.update(sorted(header.items(), key=lambda item: item[1]["data_offsets"]))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + n :]


def _totals(records: list[dict[str, Any]], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
    stored = sum(t.numel() for t in tensors.values())
    tt = sum(r["params"] for r in records)
    tt_dense = sum(r["dense_params"] for r in records)
    dense_equivalent = stored - tt + tt_dense
    return {
        "stored_params": stored,
        "tt_params": tt,
        "tt_dense_params": tt_dense,
        "dense_equivalent_params": dense_equivalent,
        "tensorized_layers": len(records),
        "tensorized_ratio": ratio(tt_dense, tt) if records else None,
        "model_ratio": ratio(dense_equivalent, stored),
    }


def _weights_entry(
    blob: bytes, tensors: Mapping[str, Tensor], records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Sizes and checksum of the weights file; ``file_ratio`` is measured on the file.

    ``dense_equivalent_bytes`` swaps each layer's stored core bytes for its dense weight at
    the cores' element size, so the ratio compares like with like whatever ``dtype`` was used.
    """
    nbytes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    payload = sum(nbytes.values())
    dense = payload
    for r in records:
        keys = [core_key(r["name"], k) for k in range(len(r["ranks"]) - 1)]
        dense += r["dense_params"] * tensors[keys[0]].element_size()
        dense -= sum(nbytes[k] for k in keys)
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return {
        "file": WEIGHTS_FILE,
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "storage_dtypes": sorted(dtype_name(d) for d in floating),
        "payload_bytes": payload,  # stored entries x bytes per element
        "header_bytes": len(blob) - payload,
        "dense_equivalent_bytes": dense,
        "file_ratio": ratio(dense, len(blob)),
    }


def _manifest_text(manifest: Mapping[str, Any]) -> str:
    """Indented JSON with one line per layer record (readable, and diffable by layer)."""
    marker = "@@layers-" + hashlib.sha256(repr(manifest).encode()).hexdigest()[:16]
    text = json.dumps({**manifest, "layers": marker}, indent=2, allow_nan=False)
    rows = [json.dumps(r, allow_nan=False) for r in manifest["layers"]]
    layers = "[\n    " + ",\n    ".join(rows) + "\n  ]" if rows else "[]"
    return text.replace(json.dumps(marker), layers, 1) + "\n"


def export_compressed(
    model: nn.Module,
    out_dir: str | Path,
    *,
    arch: str,
    model_config: Mapping[str, Any],
    options: Mapping[str, Any] | TensorizeOptions | None,
    tensorized: bool,
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> ExportInfo:
    """Write ``out_dir/model.safetensors`` and ``out_dir/manifest.json``; see the module doc.

    ``model_config`` / ``options`` are what ``get_workload(arch).build`` needs to rebuild the
    architecture (``config.to_dict()``, ``TensorizeOptions.to_dict()``); both are validated
    before anything is written. ``metrics`` and ``extra`` must be JSON-like.
    """

    if dtype is not None and dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or None, got {dtype}")
    if not isinstance(tensorized, bool):
        raise ValueError(f"tensorized must be True or False, got {tensorized!r}")
    config_dict, options_dict = _normalized(arch, model_config, options)
    metrics = json_safe(dict(metrics or {}), "metrics")
    extra = json_safe(dict(extra or {}), "extra")
    source = _source_dtype(model)

    cores_by_key, records = _shrunk_cores(model)
    tensors = _stored_tensors(model, cores_by_key, dtype)
    blob = _canonical(safetensors.torch.save(tensors, metadata={"format": "pt", "comera": FORMAT}))
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "engine_version": __version__,
        "torch_version": torch.__version__,
        "arch": arch,
        "model_config": config_dict,
        "options": options_dict,
        "tensorized": tensorized,
        "dtype": dtype_name(source),
        "layers": records,
        "totals": _totals(records, tensors),
        "weights": _weights_entry(blob, tensors, records),
        "metrics": metrics,
        "extra": extra,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights_path, manifest_path = out / WEIGHTS_FILE, out / MANIFEST_FILE
    text = _manifest_text(manifest)
    atomic_write(weights_path, blob)
    atomic_write(manifest_path, text.encode("utf-8"))
    return ExportInfo(
        out, weights_path, manifest_path, len(blob), manifest["weights"]["sha256"], manifest
    )

"""``load_compressed``: rebuild an inference model from a compressed checkpoint, no trainer.

Steps: read and validate ``manifest.json``; read ``model.safetensors`` as bytes and check its
size and sha256 against the manifest (the same bytes are then parsed, so what is checked is
what is loaded); build the architecture through the workload registry exactly as recorded
(``arch``, ``model_config``, ``options``, ``tensorized``); resize every TT / TTM layer to the
recorded ranks (the fresh build has the initial ranks: each core's ``data`` is replaced by an
empty tensor of the stored shape and each gate by ones at the new rank, as export folded the
gates into the cores); then load the tensors strictly: every stored key must exist with the
same shape and every model key except the gates must be stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn

from engine.export.manifest import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    gate_keys,
    parse_dtype,
    read_manifest,
    tt_modules,
)
from engine.models.registry import WORKLOADS, TensorizeOptions, Workload, get_workload
from engine.nn.tt_linear import TTLinear

__all__ = ["load_compressed", "read_weights", "build_from_manifest"]

_MODES = {"tt_linear": ("in_modes", "out_modes"), "ttm_embedding": ("row_modes", "col_modes")}


def _checkpoint_dir(path: str | Path) -> Path:
    path = Path(path)
    return path.parent if path.name == MANIFEST_FILE and path.is_file() else path


def read_weights(directory: str | Path, manifest: Mapping[str, Any]) -> dict[str, Tensor]:
    """The stored tensors (CPU), after checking byte size and sha256 against the manifest."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} at {path}")
    blob = path.read_bytes()
    expected = manifest["weights"]
    if "bytes" in expected and len(blob) != expected["bytes"]:
        raise CheckpointError(
            f"{WEIGHTS_FILE}: size {len(blob)} bytes does not match the "
            f"manifest's {expected['bytes']} (file truncated or replaced)"
        )
    digest = hashlib.sha256(blob).hexdigest()
    if digest != expected["sha256"]:
        raise CheckpointError(
            f"{WEIGHTS_FILE}: sha256 {digest} does not match the manifest's "
            f"{expected['sha256']} (file corrupted or modified)"
        )
    try:
        return safetensors.torch.load(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{WEIGHTS_FILE}: not a readable safetensors file ({exc})") from None


# -- building -------------------------------------------------------------------------------
def _workload(manifest: Mapping[str, Any]) -> Workload:
    try:
        return get_workload(manifest["arch"])
    except ValueError:
        raise CheckpointError(
            f"manifest.json: arch {manifest['arch']!r} is not known to this "
            f"engine; known: {sorted(WORKLOADS)}"
        ) from None


def _resize_(model: nn.Module, layers: list[dict[str, Any]]) -> None:
    """Give every TT / TTM layer the recorded modes' cores at the recorded ranks."""
    built = tt_modules(model)
    recorded = {rec["name"]: rec for rec in layers}
    if set(built) != set(recorded):
        raise CheckpointError(
            f"manifest.json: tensorized layers do not match the built architecture; only in "
            f"the manifest: {sorted(set(recorded) - set(built))}, only in the model: "
            f"{sorted(set(built) - set(recorded))}"
        )
    for name, mod in built.items():
        rec = recorded[name]
        kind = "tt_linear" if isinstance(mod, TTLinear) else "ttm_embedding"
        if rec["kind"] != kind:
            raise CheckpointError(
                f"manifest.json: layer {name!r} is {rec['kind']} in the "
                f"manifest but {kind} in the built model"
            )
        first, second = _MODES[kind]
        have = (list(getattr(mod, first)), list(getattr(mod, second)))
        if have != (rec[first], rec[second]):
            raise CheckpointError(
                f"manifest.json: layer {name!r} has {first}/{second} {rec[first]}/"
                f"{rec[second]} but the built model has {have[0]}/{have[1]}"
            )
        ranks = rec["ranks"]
        with torch.no_grad():
            for k, core in enumerate(mod.cores):
                shape = (ranks[k], *core.shape[1:-1], ranks[k + 1])
                core.data = torch.empty(shape, dtype=core.dtype, device=core.device)
            for k, gate in enumerate(mod.gates):
                gate.data = torch.ones(ranks[k + 1], dtype=gate.dtype, device=gate.device)
        if "gate_threshold" in rec:
            mod.gate_threshold = float(rec["gate_threshold"])
        if hasattr(mod, "_plan"):
            mod._plan = None  # TTMEmbedding caches its lookup plan by core shapes


def _load_strict_(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    own = model.state_dict()
    gates = gate_keys(model)
    expected = set(own) - gates
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{WEIGHTS_FILE}: keys do not match the model; missing "
            f"{missing[:10]}, unexpected {unexpected[:10]}"
        )
    wrong = [
        f"{k}: stored {tuple(tensors[k].shape)}, model {tuple(own[k].shape)}"
        for k in sorted(expected)
        if tensors[k].shape != own[k].shape
    ]
    if wrong:
        raise CheckpointError(f"{WEIGHTS_FILE}: shape mismatches: {wrong[:10]}")
    result = model.load_state_dict(tensors, strict=False)
    if set(result.missing_keys) != gates or result.unexpected_keys:  # checked above
        raise CheckpointError(f"{WEIGHTS_FILE}: keys do not match the model ({result})")


def build_from_manifest(
    manifest: Mapping[str, Any], *, dtype: torch.dtype | None = None
) -> nn.Module:
    """The recorded architecture at the recorded ranks (uninitialized cores), on the CPU."""
    workload = _workload(manifest)
    try:
        config = workload.config_from_dict(manifest["model_config"])
        options = TensorizeOptions.from_dict(manifest["options"])
        model = workload.build(config, tensorized=manifest["tensorized"], options=options)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"manifest.json: invalid model_config or options ({exc})") from None
    model.to(dtype=dtype if dtype is not None else parse_dtype(manifest["dtype"], "dtype"))
    _resize_(model, manifest["layers"])
    return model


def load_compressed(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint directory written by ``export_compressed``: ``(model, manifest)``.

    The model is in eval mode on ``device``, in ``dtype`` (default: the dtype it was trained
    in, recorded in the manifest; a ``bfloat16`` file is upcast on load). Raises
    :class:`~engine.export.manifest.CheckpointError` (a ``ValueError``) on any mismatch.
    """
    directory = _checkpoint_dir(path)
    manifest = read_manifest(directory)
    workload = _workload(manifest)  # an unknown arch fails before the weights are read
    tensors = read_weights(directory, manifest)
    try:  # a checkpoint of an earlier version of the workload, under today's names
        manifest, tensors = workload.upgrade_checkpoint(manifest, tensors)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    model = build_from_manifest(manifest, dtype=dtype)
    _load_strict_(model, tensors)
    return model.to(device).eval(), manifest

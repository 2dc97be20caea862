"""Self-describing training checkpoints: one safetensors file, no pickle.

A checkpoint holds everything exact resume needs: the model (cores and gates at their current,
possibly shrunk, shapes), the optimizer (per-parameter moments, step counters, GaLore
projection matrices, param-group hyper-parameters), RNG states, and the trainer's position
(stage, step, epoch, batch) with the job config. Tensors are safetensors entries::

    model/<param or buffer name>
    optim/<param name>/<state key>            Adam moments, step
    optim/<param name>/projector.ortho_matrix  GaLore projection
    rng/torch, rng/cuda/<i>

and everything else is one JSON document in the safetensors header metadata (``comera``).
Files are written to a temporary name, fsynced and renamed, so a crash never leaves a
half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

__all__ = [
    "FORMAT_VERSION",
    "save_checkpoint",
    "read_checkpoint",
    "load_model_state_",
    "optimizer_tensors",
    "load_optimizer_state_",
    "rng_tensors",
    "restore_rng",
    "resize_parameters_",
    "atomic_write_bytes",
]

FORMAT_VERSION = 1
_PROJECTOR_FIELDS = ("rank", "verbose", "update_proj_gap", "scale", "proj_type")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(
    path: str | Path, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> Path:
    """Write ``tensors`` and the JSON ``meta`` atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    body = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    header = {"comera": json.dumps({"format_version": FORMAT_VERSION, **meta})}
    save_file(body, str(tmp), metadata=header)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def read_checkpoint(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(tensors, meta)`` of a checkpoint; raises ``ValueError`` if it is not one of ours."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as err:  # safetensors raises its own error types
        raise ValueError(f"{path}: not a readable safetensors checkpoint ({err})") from None
    if "comera" not in header:
        raise ValueError(f"{path}: no CoMERA metadata in the safetensors header")
    meta = json.loads(header["comera"])
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {meta.get('format_version')!r}, this "
            f"engine reads {FORMAT_VERSION}"
        )
    return tensors, meta


# -- model ----------------------------------------------------------------------------------
def resize_parameters_(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give every parameter the shape it has in ``state`` (cores and gates after shrinks)."""
    for name, p in model.named_parameters():
        saved = state.get(name)
        if saved is not None and tuple(saved.shape) != tuple(p.shape):
            p.data = torch.empty(saved.shape, dtype=p.dtype, device=p.device)


def load_model_state_(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    state = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    resize_parameters_(model, state)
    model.load_state_dict(state, strict=True)


# -- optimizer ------------------------------------------------------------------------------
def optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: Mapping[nn.Parameter, str]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Optimizer state as (tensors, JSON): moments as tensors, scalars and groups as JSON."""
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    strides: dict[str, list[int]] = {}  # layouts to restore: BLAS rounds by memory layout

    def put(key: str, value: Tensor) -> None:
        tensors[key] = value
        if not value.is_contiguous():
            strides[key] = list(value.stride())

    for p, state in optimizer.state.items():
        pname = names[p]
        for key, value in state.items():
            if isinstance(value, Tensor):
                put(f"optim/{pname}/{key}", value)
            elif isinstance(value, bool | int | float):
                scalars.setdefault(pname, {})[key] = value
            elif key == "projector":  # galore_torch.GaLoreProjector
                if isinstance(value.ortho_matrix, Tensor):
                    put(f"optim/{pname}/projector.ortho_matrix", value.ortho_matrix)
                proj = {f: getattr(value, f) for f in _PROJECTOR_FIELDS}
                scalars.setdefault(pname, {})["projector"] = proj
            else:
                raise TypeError(
                    f"cannot checkpoint optimizer state {key!r} of type {type(value).__name__}"
                )
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for g in groups:
        for k, v in list(g.items()):
            if isinstance(v, tuple):
                g[k] = list(v)
            elif isinstance(v, Tensor):
                g[k] = v.item()
    return tensors, {"groups": groups, "scalars": scalars, "strides": strides}


def _restore(value: Tensor, device: torch.device, stride: list[int] | None) -> Tensor:
    """A private copy of ``value`` on ``device`` with the saved memory layout."""
    if stride is None:
        return value.to(device).clone()
    out = torch.empty_strided(value.shape, stride, dtype=value.dtype, device=device)
    return out.copy_(value)


def load_optimizer_state_(
    optimizer: torch.optim.Optimizer,
    names: Mapping[nn.Parameter, str],
    tensors: Mapping[str, Tensor],
    meta: Mapping[str, Any],
) -> None:
    """Inverse of :func:`optimizer_tensors` (state tensors are copied, never aliased)."""
    groups = meta["groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"checkpoint has {len(groups)} param groups, optimizer has "
            f"{len(optimizer.param_groups)}"
        )
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        for k, v in saved.items():
            group[k] = tuple(v) if isinstance(v, list) else v
    by_name = {n: p for p, n in names.items()}
    per_param: dict[str, dict[str, Any]] = {}
    strides = meta.get("strides", {})
    for key, value in tensors.items():
        if key.startswith("optim/"):
            pname, skey = key[len("optim/") :].rsplit("/", 1)
            per_param.setdefault(pname, {})[skey] = value
    for pname, extra in meta["scalars"].items():
        per_param.setdefault(pname, {}).update(extra)
    optimizer.state.clear()
    for pname, state in per_param.items():
        p = by_name[pname]
        restored: dict[str, Any] = {}
        for key, value in state.items():
            if key == "projector.ortho_matrix":
                continue
            if key == "projector":
                from galore_torch.galore_projector import GaLoreProjector

                proj = GaLoreProjector(
                    value["rank"],
                    verbose=value["verbose"],
                    update_proj_gap=value["update_proj_gap"],
                    scale=value["scale"],
                    proj_type=value["proj_type"],
                )
                ortho = state.get("projector.ortho_matrix")
                proj.ortho_matrix = (
                    None
                    if ortho is None
                    else _restore(
                        ortho, p.device, strides.get(f"optim/{pname}/projector.ortho_matrix")
                    )
                )
                restored[key] = proj
            elif isinstance(value, Tensor):
                dev = value.device if value.dim() == 0 and key == "step" else p.device
                restored[key] = _restore(value, dev, strides.get(f"optim/{pname}/{key}"))
            else:
                restored[key] = value
        optimizer.state[p] = restored


# -- RNG --------------------------------------------------------------------------------------
def rng_tensors() -> dict[str, Tensor]:
    out = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda/{i}"] = state
    return out


def restore_rng(tensors: Mapping[str, Tensor]) -> None:
    torch.set_rng_state(tensors["rng/torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])

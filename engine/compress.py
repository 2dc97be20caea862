"""``compress_(model, config, filter_fn)``: swap ``nn.Linear`` / ``nn.Embedding`` for TT / TTM.

The one user-facing verb, in the shape of torchao's ``quantize_``::

    summary = compress_(model, CompressConfig(max_rank=30))
    print(summary)

Every ``nn.Linear`` becomes a :class:`~engine.nn.tt_linear.TTLinear` and every ``nn.Embedding``
a :class:`~engine.nn.ttm_embedding.TTMEmbedding`, in place, on the original device and dtype.
``init="svd"`` starts from the TT-SVD of the existing weights (Part B item 12: pretrained
start); ``init="random"`` draws fresh variance-preserving cores (training from scratch).
Per-layer settings go in ``overrides``, keyed by fully-qualified module name or an
``fnmatch`` pattern; an exact name wins over patterns, and among patterns the first in
insertion order wins.

All replacements are built before any is installed, so an error leaves the model untouched.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import CompressionSummary, LayerSummary, SkippedLayer
from engine.tt.decompose import embedding_to_ttm, matrix_to_tt

__all__ = ["LayerOverride", "CompressConfig", "compress_", "CompressionSummary", "LayerSummary"]

CONFIG_VERSION = 1
INIT_METHODS = ("svd", "random")
FilterFn = Callable[[nn.Module, str], bool]


# -- validation helpers ---------------------------------------------------------------------
def _int_at_least(value: object, low: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _int_tuple(value: object, name: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of integers, got {value!r}")
    return tuple(_int_at_least(v, 1, f"{name} entries") for v in value)


def _from_dict(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}")
    return dict(data)


# -- configs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerOverride:
    """Per-layer settings; ``None`` fields fall back to the :class:`CompressConfig`.

    ``in_modes`` / ``out_modes`` apply to linears, ``row_modes`` / ``col_modes`` to embeddings.
    ``ranks`` (internal or full vector) are exact ranks for ``init="random"`` and per-bond caps
    for ``init="svd"``; when given, ``max_rank`` is not used for that layer.
    """

    in_modes: tuple[int, ...] | None = None
    out_modes: tuple[int, ...] | None = None
    row_modes: tuple[int, ...] | None = None
    col_modes: tuple[int, ...] | None = None
    ranks: tuple[int, ...] | None = None
    max_rank: int | None = None
    skip: bool = False

    def __post_init__(self) -> None:
        for name in ("in_modes", "out_modes", "row_modes", "col_modes", "ranks"):
            object.__setattr__(self, name, _int_tuple(getattr(self, name), name))
        if self.max_rank is not None:
            _int_at_least(self.max_rank, 1, "max_rank")
        if not isinstance(self.skip, bool):
            raise ValueError(f"skip must be a bool, got {self.skip!r}")
        for a, b in (("in_modes", "out_modes"), ("row_modes", "col_modes")):
            va, vb = getattr(self, a), getattr(self, b)
            if va is not None and vb is not None and len(va) != len(vb):
                raise ValueError(f"{a} and {b} must have the same length, got {va} and {vb}")

    @property
    def linear_only(self) -> tuple[str, ...]:
        return tuple(n for n in ("in_modes", "out_modes") if getattr(self, n) is not None)

    @property
    def embedding_only(self) -> tuple[str, ...]:
        return tuple(n for n in ("row_modes", "col_modes") if getattr(self, n) is not None)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerOverride:
        return cls(**_from_dict(cls, data))


@dataclass(frozen=True)
class CompressConfig:
    """How :func:`compress_` tensorizes a model. Serializes with :meth:`to_dict`."""

    max_rank: int = 30
    embedding_max_rank: int | None = None  # None: use max_rank
    gate_threshold: float = 1e-2
    d: int | None = None  # modes per side (linear) / cores (embedding); None: per-size default
    init: str = "svd"  # "svd": TT-SVD of the weights; "random": fresh init for training
    tol: float | None = None  # relative TT-SVD tolerance (init="svd" only)
    linear: bool = True
    embedding: bool = True
    min_features: int = 1  # linears with in or out features below this stay dense
    overrides: dict[str, LayerOverride] = field(default_factory=dict)
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"version must be {CONFIG_VERSION}, got {self.version!r}")
        _int_at_least(self.max_rank, 1, "max_rank")
        if self.embedding_max_rank is not None:
            _int_at_least(self.embedding_max_rank, 1, "embedding_max_rank")
        g = self.gate_threshold
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not 0 <= g < 1:
            raise ValueError(f"gate_threshold must be a number in [0, 1), got {g!r}")
        if self.d is not None:
            _int_at_least(self.d, 2, "d")
        if self.init not in INIT_METHODS:
            raise ValueError(f"init must be one of {INIT_METHODS}, got {self.init!r}")
        if self.tol is not None:
            t = self.tol
            if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t >= 0:
                raise ValueError(f"tol must be a number >= 0 or None, got {t!r}")
            if self.init != "svd":
                raise ValueError("tol applies only to init='svd'")
        for name in ("linear", "embedding"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _int_at_least(self.min_features, 1, "min_features")
        if not isinstance(self.overrides, Mapping):
            raise ValueError(f"overrides must be a mapping, got {type(self.overrides).__name__}")
        for key, ov in self.overrides.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"overrides keys must be non-empty strings, got {key!r}")
            if not isinstance(ov, LayerOverride):
                raise ValueError(f"overrides[{key!r}] must be a LayerOverride, got {ov!r}")
        object.__setattr__(self, "overrides", dict(self.overrides))  # defensive copy

    def override_for(self, fqn: str) -> LayerOverride | None:
        """The exact-name override, else the first matching pattern, else ``None``."""
        if fqn in self.overrides:
            return self.overrides[fqn]
        for key, ov in self.overrides.items():
            if _is_pattern(key) and fnmatch.fnmatchcase(fqn, key):
                return ov
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["overrides"] = {k: v.to_dict() for k, v in self.overrides.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompressConfig:
        kw = _from_dict(cls, data)
        if "version" not in kw:
            raise ValueError("CompressConfig: version is required")
        overrides = kw.get("overrides", {})
        if not isinstance(overrides, Mapping):
            raise ValueError(f"overrides must be a mapping, got {type(overrides).__name__}")
        kw["overrides"] = {k: LayerOverride.from_dict(v) for k, v in overrides.items()}
        return cls(**kw)


def _is_pattern(key: str) -> bool:
    return any(ch in key for ch in "*?[")


# -- handlers: one per module type ----------------------------------------------------------
def _linear_to_tt(mod: nn.Linear, cfg: CompressConfig, ov: LayerOverride) -> TTLinear:
    w = mod.weight.detach()  # (out, in)
    modes_given = ov.in_modes is not None or ov.out_modes is not None
    kw: dict[str, Any] = {
        "in_modes": ov.in_modes, "out_modes": ov.out_modes,
        "gate_threshold": cfg.gate_threshold, "d": None if modes_given else cfg.d,
    }  # fmt: skip
    max_rank = ov.max_rank if ov.max_rank is not None else cfg.max_rank
    shape = (mod.in_features, mod.out_features, mod.bias is not None)
    if cfg.init == "random":
        return TTLinear(*shape, max_rank=max_rank, ranks=ov.ranks, device=w.device,
                        dtype=w.dtype, **kw)
    if ov.ranks is None:
        return TTLinear.from_linear(mod, max_rank=max_rank, tol=cfg.tol, **kw)
    # per-bond caps: resolve modes and ranks on meta, TT-SVD with those caps, then copy in
    probe = TTLinear(*shape, max_rank=max_rank, ranks=ov.ranks, device="meta", **kw)
    cores = matrix_to_tt(w, probe.in_modes, probe.out_modes, max_rank=list(probe.ranks[1:-1]),
                         tol=cfg.tol)  # each (r_{k-1}, s_k, r_k)
    ranks = [c.shape[0] for c in cores] + [1]
    layer = TTLinear(*shape, ranks=ranks, device=w.device, dtype=w.dtype,
                     **{**kw, "in_modes": probe.in_modes, "out_modes": probe.out_modes, "d": None})
    with torch.no_grad():
        for p, c in zip(layer.cores, cores, strict=True):
            p.copy_(c)
        if mod.bias is not None:
            layer.bias.copy_(mod.bias)
    return layer


def _embedding_to_ttm(mod: nn.Embedding, cfg: CompressConfig, ov: LayerOverride) -> TTMEmbedding:
    w = mod.weight.detach()  # (V, D)
    modes_given = ov.row_modes is not None or ov.col_modes is not None
    kw: dict[str, Any] = {
        "row_modes": ov.row_modes, "col_modes": ov.col_modes,
        "gate_threshold": cfg.gate_threshold, "d": None if modes_given else cfg.d,
    }  # fmt: skip
    max_rank = ov.max_rank or cfg.embedding_max_rank or cfg.max_rank
    shape = (mod.num_embeddings, mod.embedding_dim)
    if cfg.init == "random":
        return TTMEmbedding(*shape, max_rank=max_rank, ranks=ov.ranks, device=w.device,
                            dtype=w.dtype, padding_idx=mod.padding_idx, **kw)
    if ov.ranks is None:
        return TTMEmbedding.from_embedding(mod, max_rank=max_rank, tol=cfg.tol, **kw)
    probe = TTMEmbedding(*shape, max_rank=max_rank, ranks=ov.ranks, device="meta", **kw)
    cores = embedding_to_ttm(w, probe.row_modes, probe.col_modes,
                             max_rank=list(probe.ranks[1:-1]), tol=cfg.tol)  # (r, n, m, r')
    ranks = [c.shape[0] for c in cores] + [1]
    kw.update(row_modes=probe.row_modes, col_modes=probe.col_modes, d=None)
    layer = TTMEmbedding(*shape, ranks=ranks, device=w.device, dtype=w.dtype,
                         padding_idx=mod.padding_idx, **kw)
    with torch.no_grad():
        for p, c in zip(layer.cores, cores, strict=True):
            p.copy_(c)
    return layer


_HANDLERS: dict[type[nn.Module], tuple[str, Callable[..., nn.Module]]] = {
    nn.Linear: ("linear", _linear_to_tt),
    nn.Embedding: ("embedding", _embedding_to_ttm),
}


def _kind_of(mod: nn.Module) -> str | None:
    for cls, (kind, _) in _HANDLERS.items():
        if isinstance(mod, cls):
            return kind
    return None


def _row(name: str, kind: str, mod: nn.Module) -> LayerSummary:
    if isinstance(mod, TTLinear):
        a, b = mod.in_modes, mod.out_modes
        pad = (math.prod(a) - mod.in_features, math.prod(b) - mod.out_features)
    else:
        assert isinstance(mod, TTMEmbedding)
        a, b = mod.row_modes, mod.col_modes
        pad = (math.prod(a) - mod.num_embeddings, math.prod(b) - mod.embedding_dim)
    return LayerSummary(
        name=name, kind=kind, in_modes=tuple(a), out_modes=tuple(b),
        ranks=tuple(int(r) for r in mod.ranks), dense_params=mod.dense_parameters(),
        tt_params=mod.tt_parameters(), gate_params=sum(g.numel() for g in mod.gates),
        padding=pad,
    )  # fmt: skip


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the verb -------------------------------------------------------------------------------
def _skip_reason(
    model: nn.Module, fqn: str, mod: nn.Module, kind: str, cfg: CompressConfig,
    ov: LayerOverride | None, filter_fn: FilterFn | None, owners: Mapping[int, set[int]],
) -> str | None:  # fmt: skip
    if not getattr(cfg, kind):
        return f"{kind}=False in config"
    if fqn == "":
        return "the root module cannot be replaced in place"
    parent = model.get_submodule(fqn.rpartition(".")[0])
    if isinstance(parent, nn.MultiheadAttention):
        return "nn.MultiheadAttention reads its out_proj weight directly"
    if kind == "embedding" and mod.max_norm is not None:
        return "max_norm renormalization has no TTM equivalent"
    if len(owners[id(mod.weight)]) > 1:
        return "weight is shared with another module (tied weights)"
    if ov is not None and ov.skip:
        return "override skip=True"
    if filter_fn is not None and not filter_fn(mod, fqn):
        return "filter_fn returned False"
    if kind == "linear" and min(mod.in_features, mod.out_features) < cfg.min_features:
        return f"in or out features below min_features={cfg.min_features}"
    return None


def compress_(
    model: nn.Module, config: CompressConfig | None = None, filter_fn: FilterFn | None = None
) -> CompressionSummary:
    """Replace ``nn.Linear`` / ``nn.Embedding`` modules of ``model`` by TT / TTM in place.

    ``filter_fn(module, fqn)`` further restricts the candidates (the config's ``linear`` /
    ``embedding`` flags, ``min_features`` and ``skip`` overrides apply as well). A module
    reachable under several names is replaced once, everywhere. Modules whose weight is tied
    to another module, children of ``nn.MultiheadAttention``, and embeddings with
    ``max_norm`` stay dense; the summary lists every candidate left dense and why.
    """
    cfg = config if config is not None else CompressConfig()
    if not isinstance(cfg, CompressConfig):
        raise TypeError(f"config must be a CompressConfig, got {type(cfg).__name__}")
    before = _count(model)
    owners: dict[int, set[int]] = {}
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(id(mod))

    sites: list[tuple[str, nn.Module]] = list(model.named_modules(remove_duplicate=False))
    names = {fqn for fqn, mod in sites if _kind_of(mod) is not None}
    for key in cfg.overrides:
        if not _is_pattern(key) and key not in names:
            raise ValueError(f"overrides[{key!r}] names no nn.Linear or nn.Embedding in the model")

    new: dict[int, nn.Module] = {}  # id(old module) -> replacement
    rows: list[LayerSummary] = []
    skipped: list[SkippedLayer] = []
    seen: set[int] = set()
    for fqn, mod in sites:
        kind = _kind_of(mod)
        if kind is None or id(mod) in seen:
            continue
        seen.add(id(mod))
        ov = cfg.override_for(fqn)
        reason = _skip_reason(model, fqn, mod, kind, cfg, ov, filter_fn, owners)
        if reason is not None:
            skipped.append(SkippedLayer(fqn, kind, reason))
            continue
        ov = ov or LayerOverride()
        wrong = ov.embedding_only if kind == "linear" else ov.linear_only
        if wrong:
            raise ValueError(f"override for {fqn!r} sets {', '.join(wrong)} but it is a {kind}")
        handler = next(h for cls, (_, h) in _HANDLERS.items() if isinstance(mod, cls))
        try:
            replacement = handler(mod, cfg, ov)
        except ValueError as err:
            raise ValueError(f"cannot compress {fqn!r}: {err}") from err
        replacement.train(mod.training)
        replacement.requires_grad_(mod.weight.requires_grad)
        new[id(mod)] = replacement
        rows.append(_row(fqn, kind, replacement))

    for fqn, mod in sites:  # install everywhere the module is reachable
        if id(mod) in new:
            parent_name, _, attr = fqn.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, new[id(mod)])
    return CompressionSummary(
        layers=tuple(rows), skipped=tuple(skipped), model_params_before=before,
        model_params_after=_count(model), config=cfg.to_dict(),
    )  # fmt: skip

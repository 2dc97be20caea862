"""``compress_(model, config, filter_fn)``: swap ``nn.Linear`` / ``nn.Embedding`` for TT / TTM.

The one user-facing verb, in the shape of torchao's ``quantize_``::

    summary = compress_(model, CompressConfig(max_rank=30))
    print(summary)

Every ``nn.Linear`` becomes a :class:`~engine.nn.tt_linear.TTLinear` and every ``nn.Embedding`` a
:class:`~engine.nn.ttm_embedding.TTMEmbedding`, in place, on the original device and dtype.
``init="svd"`` starts from the TT-SVD of the existing weights (a pretrained start,
docs/method.md#pretrained-models); ``init="random"`` draws fresh variance-preserving cores (training
from scratch). Per-layer settings go in ``overrides``, keyed by fully-qualified module name or an
``fnmatch`` pattern; an exact name wins over patterns, and among patterns the first in insertion
order wins.

All replacements are built before any is installed, so an error leaves the model untouched.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.configs import ConfigError, ConfigMethods, parse, spec, validate
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import CompressionSummary, LayerSummary, SkippedLayer
from engine.tt.decompose import embedding_to_ttm, matrix_to_tt

__all__ = ["LayerOverride", "CompressConfig", "compress_", "CompressionSummary", "LayerSummary"]

CONFIG_VERSION = 1
INIT_METHODS = ("svd", "random")
FilterFn = Callable[[nn.Module, str], bool]


# -- configs --------------------------------------------------------------------------------
def _modes() -> Any:
    return spec(None, ge=1, length=(1, 16))  # a factorization: 1-16 positive integers


@dataclass(frozen=True)
class LayerOverride(ConfigMethods):
    """Per-layer settings; ``None`` fields fall back to the :class:`CompressConfig`.

    ``in_modes`` / ``out_modes`` apply to linears, ``row_modes`` / ``col_modes`` to embeddings.
    ``ranks`` (internal or full vector) are exact ranks for ``init="random"`` and per-bond caps
    for ``init="svd"``; when given, ``max_rank`` is not used for that layer.
    """

    in_modes: tuple[int, ...] | None = _modes()
    out_modes: tuple[int, ...] | None = _modes()
    row_modes: tuple[int, ...] | None = _modes()
    col_modes: tuple[int, ...] | None = _modes()
    ranks: tuple[int, ...] | None = spec(None, ge=1, length=(1, 17))
    max_rank: int | None = spec(None, ge=1)
    skip: bool = False

    def __post_init__(self) -> None:
        validate(self)
        for a, b in (("in_modes", "out_modes"), ("row_modes", "col_modes")):
            va, vb = getattr(self, a), getattr(self, b)
            if va is not None and vb is not None and len(va) != len(vb):
                raise ConfigError(b, f"must have the length of {a}, got {va} and {vb}")

    @property
    def linear_only(self) -> tuple[str, ...]:
        return tuple(n for n in ("in_modes", "out_modes") if getattr(self, n) is not None)

    @property
    def embedding_only(self) -> tuple[str, ...]:
        return tuple(n for n in ("row_modes", "col_modes") if getattr(self, n) is not None)


def _overrides(value: Any) -> dict[str, LayerOverride]:
    """``{name or pattern: LayerOverride or its mapping}``, each checked under its key."""
    if not isinstance(value, Mapping):
        raise ConfigError("", f"must be an object, got {type(value).__name__}")
    out = {}
    for key, ov in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError("", f"keys must be non-empty strings, got {key!r}")
        out[key] = ov if isinstance(ov, LayerOverride) else parse(LayerOverride, ov, f"[{key!r}]")
    return out


@dataclass(frozen=True)
class CompressConfig(ConfigMethods):
    """How :func:`compress_` tensorizes a model. Serializes with :meth:`to_dict`."""

    REQUIRED = ("version",)

    max_rank: int = spec(30, ge=1)
    embedding_max_rank: int | None = spec(None, ge=1)  # None: use max_rank
    gate_threshold: float = spec(1e-2, ge=0, lt=1)
    d: int | None = spec(None, ge=2)  # modes per side / cores (embedding); None: by size
    init: str = spec("svd", choices=INIT_METHODS)  # "svd": TT-SVD of the weights; "random"
    tol: float | None = spec(None, ge=0)  # relative TT-SVD tolerance (init="svd" only)
    linear: bool = True
    embedding: bool = True
    min_features: int = spec(1, ge=1)  # linears with in or out features below this stay dense
    overrides: dict[str, LayerOverride] = spec(factory=dict, convert=_overrides)
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)
        if self.tol is not None and self.init != "svd":
            raise ConfigError("tol", "applies only to init='svd'")

    def override_for(self, fqn: str) -> LayerOverride | None:
        """The exact-name override, else the first matching pattern, else ``None``."""
        if fqn in self.overrides:
            return self.overrides[fqn]
        for key, ov in self.overrides.items():
            if _is_pattern(key) and fnmatch.fnmatchcase(fqn, key):
                return ov
        return None


def _is_pattern(key: str) -> bool:
    return any(ch in key for ch in "*?[")


# -- handlers: one per module type ----------------------------------------------------------
def _layer_kw(cfg: CompressConfig, modes: dict[str, Any]) -> dict[str, Any]:
    """The TT / TTM constructor's ``modes`` (the override's, ``None`` where not given),
    ``gate_threshold`` and ``d`` (``None`` once any modes are given)."""
    given = any(m is not None for m in modes.values())
    return {**modes, "gate_threshold": cfg.gate_threshold, "d": None if given else cfg.d}


def _linear_to_tt(mod: nn.Linear, cfg: CompressConfig, ov: LayerOverride) -> TTLinear:
    w = mod.weight.detach()  # (out, in)
    kw = _layer_kw(cfg, {"in_modes": ov.in_modes, "out_modes": ov.out_modes})
    max_rank = ov.max_rank if ov.max_rank is not None else cfg.max_rank
    shape = (mod.in_features, mod.out_features, mod.bias is not None)
    if cfg.init == "random":
        return TTLinear(
            *shape, max_rank=max_rank, ranks=ov.ranks, device=w.device, dtype=w.dtype, **kw
        )
    if ov.ranks is None:
        return TTLinear.from_linear(mod, max_rank=max_rank, tol=cfg.tol, **kw)
    # per-bond caps: resolve modes and ranks on meta, TT-SVD with those caps, then copy in
    probe = TTLinear(*shape, max_rank=max_rank, ranks=ov.ranks, device="meta", **kw)
    cores = matrix_to_tt(
        w, probe.in_modes, probe.out_modes, max_rank=list(probe.ranks[1:-1]), tol=cfg.tol
    )  # each (r_{k-1}, s_k, r_k)
    ranks = [c.shape[0] for c in cores] + [1]
    layer = TTLinear(
        *shape,
        ranks=ranks,
        device=w.device,
        dtype=w.dtype,
        **{**kw, "in_modes": probe.in_modes, "out_modes": probe.out_modes, "d": None},
    )
    with torch.no_grad():
        for p, c in zip(layer.cores, cores, strict=True):
            p.copy_(c)
        if mod.bias is not None:
            layer.bias.copy_(mod.bias)
    return layer


def _embedding_to_ttm(mod: nn.Embedding, cfg: CompressConfig, ov: LayerOverride) -> TTMEmbedding:
    w = mod.weight.detach()  # (V, D)
    kw = _layer_kw(cfg, {"row_modes": ov.row_modes, "col_modes": ov.col_modes})
    max_rank = ov.max_rank or cfg.embedding_max_rank or cfg.max_rank
    shape = (mod.num_embeddings, mod.embedding_dim)
    if cfg.init == "random":
        return TTMEmbedding(
            *shape,
            max_rank=max_rank,
            ranks=ov.ranks,
            device=w.device,
            dtype=w.dtype,
            padding_idx=mod.padding_idx,
            **kw,
        )
    if ov.ranks is None:
        return TTMEmbedding.from_embedding(mod, max_rank=max_rank, tol=cfg.tol, **kw)
    probe = TTMEmbedding(*shape, max_rank=max_rank, ranks=ov.ranks, device="meta", **kw)
    cores = embedding_to_ttm(
        w, probe.row_modes, probe.col_modes, max_rank=list(probe.ranks[1:-1]), tol=cfg.tol
    )  # (r, n, m, r')
    ranks = [c.shape[0] for c in cores] + [1]
    kw.update(row_modes=probe.row_modes, col_modes=probe.col_modes, d=None)
    layer = TTMEmbedding(
        *shape, ranks=ranks, device=w.device, dtype=w.dtype, padding_idx=mod.padding_idx, **kw
    )
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
        name=name,
        kind=kind,
        in_modes=tuple(a),
        out_modes=tuple(b),
        ranks=tuple(int(r) for r in mod.ranks),
        dense_params=mod.dense_parameters(),
        tt_params=mod.tt_parameters(),
        gate_params=sum(g.numel() for g in mod.gates),
        padding=pad,
    )


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the verb -------------------------------------------------------------------------------
def _skip_reason(
    model: nn.Module,
    fqn: str,
    mod: nn.Module,
    kind: str,
    cfg: CompressConfig,
    ov: LayerOverride | None,
    filter_fn: FilterFn | None,
    owners: Mapping[int, set[int]],
) -> str | None:
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
        layers=tuple(rows),
        skipped=tuple(skipped),
        model_params_before=before,
        model_params_after=_count(model),
        config=cfg.to_dict(),
    )

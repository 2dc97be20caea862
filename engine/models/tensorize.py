"""Which layers of a model are built as TT / TTM, by name: options, slots and the report.

A model class asks a factory for each of its tensorizable layers. The builders hand it
factories that return placeholder :class:`Slot` modules; once the module tree exists,
:func:`materialize` walks ``named_modules()`` and swaps every slot for the real layer:

* ``TTLinear`` / ``TTMEmbedding`` when the slot's name matches one of ``options.layers``
  (``fnmatch`` patterns, e.g. ``encoder.*.ffn.*``) and the dense weight has at least
  ``options.min_size`` entries (a 16 x 32 matrix gains nothing from a TT chain) and, for a
  linear built of two cores (``W = U V``), a break-even rank of at least
  :data:`MIN_BREAK_EVEN_RANK` (:func:`break_even_rank`);
* ``nn.Linear`` / ``nn.Embedding`` otherwise, recorded with the reason in the report.

Names therefore always agree with the model's real module tree, whatever order the model
creates its layers in. The result is attached to the model as ``model.tensorize_report``
(see :func:`tensorize_report`). A pattern that matches no tensorizable layer is an error, so
a typo cannot silently leave a model dense.
"""

from __future__ import annotations

import fnmatch
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from torch import nn

from engine.configs import ConfigError, ConfigMethods, spec, validate
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import SkippedLayer

__all__ = [
    "TensorizeOptions",
    "TensorizeReport",
    "Slot",
    "Specialize",
    "linear_slot",
    "embedding_slot",
    "materialize",
    "build_model",
    "break_even_rank",
    "require_matches",
    "tensorize_report",
]

M = TypeVar("M", bound=nn.Module)
Specialize = Callable[[str, "Slot"], dict[str, Any]]  # (name, slot) -> extra TT/TTM kwargs
MAX_RANK = 1024
# max_rank "auto": the rank each layer starts at is chosen by a short calibration run before
# the model is built (engine.train.auto_rank); this is its upper bound, and the rank a plan
# (which runs no calibration) builds and counts at. 64 left the 384 x 256 input layer of the
# real-data benchmark 1.4-2.8 points under dense (docs/method.md#automatic-rank)
AUTO_RANK_CAP = 256
# max_rank "auto" without d: TT linears of two cores (a rank-r product U V, d = 1 per side),
# which trained closest to dense from scratch on every real data set (the same doc section)
AUTO_LINEAR_D = 1
# a two-core linear (W = U V at rank r) holds r (n_in + n_out) entries, fewer than the dense
# n_in n_out only below its break-even rank n_in n_out / (n_in + n_out) (about the smaller
# side). Where that is under this bound the layer stays dense: each rank its early stage cuts
# is one of its few input or output dimensions (wine's 13 features went to 4: the early stage
# ended 1.67 points under dense, 0.05 with that layer dense; docs/method.md#two-core-floor)
MIN_BREAK_EVEN_RANK = 16


def _patterns(layers: Any) -> tuple[str, ...]:
    """``layers``: a list of non-empty name patterns."""
    if isinstance(layers, str) or not isinstance(layers, list | tuple):
        raise ConfigError("", f"must be a list of non-empty name patterns, got {layers!r}")
    if not all(isinstance(p, str) and 0 < len(p) <= 128 for p in layers):
        raise ConfigError(
            "", f"must be a list of name patterns of 1-128 characters, got {layers!r}"
        )
    return tuple(layers)


def _parse_modes(modes: Any) -> tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]:
    """``{pattern: {"in": [...], "out": [...]}}`` or the tuple form, validated."""
    if not isinstance(modes, Mapping | list | tuple):
        raise ConfigError("", f"must be an object of patterns, got {type(modes).__name__}")
    items = modes.items() if isinstance(modes, Mapping) else [(m[0], m[1:]) for m in modes]
    out = []
    for pattern, given in items:
        if isinstance(given, Mapping):
            if set(given) != {"in", "out"}:
                raise ConfigError("", f"[{pattern!r}] must have exactly the keys 'in' and 'out'")
            given = (given["in"], given["out"])
        n_in, n_out = (tuple(x) for x in given)
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError("", f"a pattern must be a non-empty string, got {pattern!r}")
        for side in (n_in, n_out):
            if not side or any(
                isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in side
            ):
                raise ConfigError("", f"[{pattern!r}] must list integers >= 1, got {side!r}")
        if len(n_in) != len(n_out):
            raise ConfigError(
                "",
                f"[{pattern!r}]: 'in' and 'out' need the same number of "
                f"modes, got {len(n_in)} and {len(n_out)}",
            )
        out.append((pattern, tuple(int(v) for v in n_in), tuple(int(v) for v in n_out)))
    return tuple(out)


@dataclass(frozen=True)
class TensorizeOptions(ConfigMethods):
    """How a workload builds its tensorized layers (ignored for dense models).

    ``shapes="paper"`` uses the architecture's published shapes where it has them (the MNLI
    transformer, docs/method.md#paper-shapes), ``"auto"`` factorizes every layer automatically.
    ``layers`` are ``fnmatch`` patterns over module names (``encoder.*.ffn.*``); a layer is
    tensorized when it is tensorizable by its architecture, matches one pattern and its dense
    weight has at least ``min_size`` entries. ``d`` is the number of modes per side of a
    TT linear and the number of cores of a TTM embedding (embeddings need ``d >= 2``).
    """

    # "auto": chosen per layer by a calibration run (engine.train.auto_rank), <= AUTO_RANK_CAP
    max_rank: int | str = spec(30, ge=1, le=MAX_RANK, choices=("auto",))
    # None: max_rank (transformer paper shapes: 32)
    embedding_max_rank: int | None = spec(None, ge=1, le=MAX_RANK)
    gate_threshold: float = spec(1e-2, ge=0, lt=1)
    shapes: str = spec("auto", choices=("auto", "paper"))
    d: int | None = spec(None, ge=1, le=6)
    # modes per side of the TT linears alone, where they differ from d: what max_rank "auto"
    # chose (AUTO_LINEAR_D), kept when the model is built at the calibrated rank
    linear_d: int | None = spec(None, ge=1, le=6)
    layers: tuple[str, ...] = spec(("*",), length=(1, 64), convert=_patterns)
    min_size: int = spec(1024, ge=1, le=2**40)
    # explicit factorizations: (pattern, in / row modes, out / col modes), first match wins;
    # in dict form {pattern: {"in": [...], "out": [...]}}
    modes: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = spec((), convert=_parse_modes)

    def __post_init__(self) -> None:
        validate(self)

    @property
    def rank_bound(self) -> int:
        """``max_rank`` as a number: ``AUTO_RANK_CAP`` for ``"auto"``."""
        return AUTO_RANK_CAP if self.max_rank == "auto" else int(self.max_rank)

    @property
    def linear_order(self) -> int | None:
        """Modes per side of a TT linear: ``linear_d`` if set, else ``d``;
        :data:`AUTO_LINEAR_D` under ``max_rank: "auto"`` when neither ``d`` nor paper shapes
        fix them; ``None`` (by size) otherwise. Modes given in ``modes`` still win."""
        if self.linear_d is not None:
            return self.linear_d
        if self.d is None and self.max_rank == "auto" and self.shapes == "auto":
            return AUTO_LINEAR_D
        return self.d

    @property
    def engine_two_cores(self) -> bool:
        """Whether the TT linears are two cores by the engine's choice (``max_rank: "auto"``
        without ``d``: :data:`AUTO_LINEAR_D`, kept as ``linear_d`` once the rank is
        calibrated), not by a ``d`` the job gave."""
        return self.d is None and self.linear_order == 1

    @property
    def embedding_rank(self) -> int:
        return self.embedding_max_rank if self.embedding_max_rank is not None else self.rank_bound

    def selects(self, name: str) -> bool:
        """Whether the module called ``name`` matches one of the ``layers`` patterns."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.layers)

    def explicit_modes(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The (in, out) modes given for layer ``name`` in ``modes``, if a pattern matches."""
        for pattern, n_in, n_out in self.modes:
            if fnmatch.fnmatchcase(name, pattern):
                return n_in, n_out
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = list(self.layers)
        out["modes"] = {p: {"in": list(i), "out": list(o)} for p, i, o in self.modes}
        return out


@dataclass(frozen=True)
class TensorizeReport:
    """Names built as TT / TTM, and the tensorizable layers left dense with the reason."""

    tensorized: tuple[str, ...] = ()
    skipped: tuple[SkippedLayer, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"tensorized": list(self.tensorized), "skipped": [s.to_dict() for s in self.skipped]}


class Slot(nn.Module):
    """Placeholder for a tensorizable layer; :func:`materialize` replaces it."""

    def __init__(self, kind: str, n_in: int, n_out: int, role: str = "", **kwargs: Any) -> None:
        super().__init__()
        self.kind, self.n_in, self.n_out, self.role, self.kwargs = kind, n_in, n_out, role, kwargs

    @property
    def dense_size(self) -> int:
        return self.n_in * self.n_out

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("an unbuilt Slot was called: run materialize() on the model first")

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.n_in}, {self.n_out}, role={self.role!r}"


def linear_slot(n_in: int, n_out: int, bias: bool = True, role: str = "") -> Slot:
    """Slot for ``nn.Linear(n_in, n_out, bias)`` / ``TTLinear``."""
    return Slot("linear", n_in, n_out, role, bias=bias)


def embedding_slot(num: int, dim: int, role: str = "") -> Slot:
    """Slot for ``nn.Embedding(num, dim)`` / ``TTMEmbedding`` (``n_in`` rows, ``n_out`` cols)."""
    return Slot("embedding", num, dim, role)


def _build(slot: Slot, tt: bool, options: TensorizeOptions, extra: dict[str, Any]) -> nn.Module:
    if slot.kind == "linear":
        bias = slot.kwargs["bias"]
        if not tt:
            return nn.Linear(slot.n_in, slot.n_out, bias=bias)
        kw = {
            "max_rank": options.rank_bound,
            "gate_threshold": options.gate_threshold,
            "d": options.linear_order,
            **extra,
        }
        return TTLinear(slot.n_in, slot.n_out, bias, **kw)
    if not tt:
        return nn.Embedding(slot.n_in, slot.n_out)
    kw = {
        "max_rank": options.embedding_rank,
        "gate_threshold": options.gate_threshold,
        "d": options.d,
        **extra,
    }
    return TTMEmbedding(slot.n_in, slot.n_out, **kw)


def break_even_rank(n_in: int, n_out: int) -> float:
    """The rank below which a two-core ``n_in x n_out`` linear holds fewer entries than the
    dense weight: ``n_in n_out / (n_in + n_out)``."""
    return n_in * n_out / (n_in + n_out)


def _too_small_for_two_cores(
    slot: Slot, options: TensorizeOptions, extra: dict[str, Any]
) -> str | None:
    """Why a linear the engine would build of two cores (``max_rank: "auto"`` without ``d``)
    stays dense (its break-even rank is under :data:`MIN_BREAK_EVEN_RANK`), or ``None``. A
    ``d`` or modes given (``modes``, an architecture's own shapes) are the user's choice and
    are built as given."""
    if slot.kind != "linear" or not options.engine_two_cores:
        return None
    if "in_modes" in extra:
        return None
    even = break_even_rank(slot.n_in, slot.n_out)
    if even >= MIN_BREAK_EVEN_RANK:
        return None
    return (
        f"two cores of {slot.n_in} x {slot.n_out} hold fewer entries than the dense weight only "
        f"below rank {even:.1f} (< {MIN_BREAK_EVEN_RANK}): each rank cut would be one of its "
        f"{min(slot.n_in, slot.n_out)} input or output dimensions"
    )


def require_matches(patterns: tuple[str, ...], names: list[str], where: str) -> None:
    """Every ``options.layers`` pattern must select one of ``names`` (the tensorizable layers
    of ``where``), else a ConfigError on ``layers`` lists the candidates."""
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ConfigError(
                "layers",
                f"pattern {pattern!r} matches no tensorizable layer of {where}; "
                f"candidates are {names}",
            )


def materialize(
    model: nn.Module,
    options: TensorizeOptions,
    *,
    tensorized: bool = True,
    specialize: Specialize | None = None,
) -> TensorizeReport:
    """Replace every :class:`Slot` in ``model`` by its real layer; attach and return the report.

    ``specialize(name, slot)`` may return extra keyword arguments for the TT / TTM constructor
    of a selected layer (explicit modes, ranks), overriding ``max_rank`` / ``d``.
    """
    slots = [(n, m) for n, m in model.named_modules() if isinstance(m, Slot)]
    if tensorized:
        require_matches(options.layers, [n for n, _ in slots], type(model).__name__)
    done: list[str] = []
    skipped: list[SkippedLayer] = []
    for name, slot in slots:
        reason = None
        if not tensorized:
            reason = "dense model (tensorized=False)"
        elif not options.selects(name):
            reason = f"not selected by layers={list(options.layers)}"
        elif slot.dense_size < options.min_size:
            reason = f"dense weight has {slot.dense_size} < min_size={options.min_size} entries"
        extra = specialize(name, slot) if reason is None and specialize is not None else {}
        explicit = options.explicit_modes(name) if reason is None else None
        if reason is None and explicit is None:
            reason = _too_small_for_two_cores(slot, options, extra)
        if explicit is not None:  # the user's factorization replaces the architecture's
            keys = (
                ("in_modes", "out_modes") if slot.kind == "linear" else ("row_modes", "col_modes")
            )
            extra = {k: v for k, v in extra.items() if k not in ("ranks", *keys)}
            extra.update(zip(keys, explicit, strict=True))
        try:
            layer = _build(slot, reason is None, options, extra)
        except ValueError as err:
            if explicit is not None:
                raise ConfigError(
                    "modes", f"the modes given do not fit; cannot tensorize {name!r}: {err}"
                ) from err
            raise ValueError(f"cannot tensorize {name!r}: {err}") from err
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer)
        if reason is None:
            done.append(name)
        else:
            skipped.append(SkippedLayer(name, slot.kind, reason))
    for pattern, _, _ in options.modes if tensorized else ():
        if not any(fnmatch.fnmatchcase(n, pattern) for n in done):
            raise ConfigError(
                "modes", f"pattern {pattern!r} matches no tensorized layer; tensorized are {done}"
            )
    report = TensorizeReport(tuple(done), tuple(skipped))
    model.tensorize_report = report
    return report


def build_model(
    model_class: Callable[..., M],
    config: Any,
    *,
    tensorized: bool,
    options: TensorizeOptions | None,
    slots: tuple[Callable[..., Slot], ...],
    specialize: Specialize | None = None,
) -> M:
    """``model_class(config)``, dense with an empty report; or, ``tensorized``,
    ``model_class(config, *slots)`` (the slot factories in place of its layer factories)
    made real by :func:`materialize` with ``options`` (default :class:`TensorizeOptions`)."""
    if not tensorized:
        model = model_class(config)
        model.tensorize_report = TensorizeReport()
        return model
    model = model_class(config, *slots)
    options = options if options is not None else TensorizeOptions()
    materialize(model, options, specialize=specialize)
    return model


def tensorize_report(model: nn.Module) -> TensorizeReport | None:
    """The report :func:`materialize` attached to ``model`` (``None`` if it never ran)."""
    report = getattr(model, "tensorize_report", None)
    return report if isinstance(report, TensorizeReport) else None

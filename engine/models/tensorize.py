"""Which layers of a model are built as TT / TTM, by name: options, slots and the report.

A model class asks a factory for each of its tensorizable layers. The builders hand it
factories that return placeholder :class:`Slot` modules; once the module tree exists,
:func:`materialize` walks ``named_modules()`` and swaps every slot for the real layer:

* ``TTLinear`` / ``TTMEmbedding`` when the slot's name matches one of ``options.layers``
  (``fnmatch`` patterns, e.g. ``encoder.*.ffn.*``) and the dense weight has at least
  ``options.min_size`` entries (a 16 x 32 matrix gains nothing from a TT chain);
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
from typing import Any

from torch import nn

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
    "tensorize_report",
]

Specialize = Callable[[str, "Slot"], dict[str, Any]]  # (name, slot) -> extra TT/TTM kwargs


@dataclass(frozen=True)
class TensorizeOptions:
    """How a workload builds its tensorized layers (ignored for dense models).

    ``shapes="paper"`` uses the architecture's published shapes where it has them (the MNLI
    transformer of method doc §2.3), ``"auto"`` factorizes every layer automatically.
    ``layers`` are ``fnmatch`` patterns over module names (``encoder.*.ffn.*``); a layer is
    tensorized when it is tensorizable by its architecture, matches one pattern and its dense
    weight has at least ``min_size`` entries. ``d`` is the number of modes per side of a
    TT linear and the number of cores of a TTM embedding (embeddings need ``d >= 2``).
    """

    max_rank: int = 30
    embedding_max_rank: int | None = None  # None: max_rank (transformer paper shapes: 32)
    gate_threshold: float = 1e-2
    shapes: str = "auto"
    d: int | None = None
    layers: tuple[str, ...] = ("*",)
    min_size: int = 1024
    # explicit factorizations: (pattern, in / row modes, out / col modes), first match wins;
    # in dict form {pattern: {"in": [...], "out": [...]}}
    modes: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_rank", "embedding_max_rank", "d", "min_size"):
            v = getattr(self, name)
            if v is None and name in ("embedding_max_rank", "d"):
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        t = self.gate_threshold
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t < 1:
            raise ValueError(f"gate_threshold must be in [0, 1), got {t!r}")
        if self.shapes not in ("auto", "paper"):
            raise ValueError(f"shapes must be 'auto' or 'paper', got {self.shapes!r}")
        layers = self.layers
        if isinstance(layers, str) or not all(isinstance(p, str) and p for p in layers):
            raise ValueError(f"layers must be a list of non-empty name patterns, got {layers!r}")
        object.__setattr__(self, "layers", tuple(layers))
        object.__setattr__(self, "modes", _parse_modes(self.modes))

    @property
    def embedding_rank(self) -> int:
        return self.embedding_max_rank if self.embedding_max_rank is not None else self.max_rank

    def selects(self, name: str) -> bool:
        """Whether the module called ``name`` matches one of the ``layers`` patterns."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.layers)

    def builder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the ``build_*`` functions (everything but ``shapes``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "shapes"}

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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorizeOptions:
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"TensorizeOptions: unknown keys {unknown}")
        data = dict(data)
        if "layers" in data and isinstance(data["layers"], list):
            data["layers"] = tuple(data["layers"])
        return cls(**data)


def _parse_modes(modes: Any) -> tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]:
    """``{pattern: {"in": [...], "out": [...]}}`` or the tuple form, validated."""
    items = modes.items() if isinstance(modes, Mapping) else [(m[0], m[1:]) for m in modes]
    out = []
    for pattern, spec in items:
        if isinstance(spec, Mapping):
            if set(spec) != {"in", "out"}:
                raise ValueError(f"modes[{pattern!r}] must have exactly the keys 'in' and 'out'")
            spec = (spec["in"], spec["out"])
        n_in, n_out = (tuple(x) for x in spec)
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"modes: a pattern must be a non-empty string, got {pattern!r}")
        for side in (n_in, n_out):
            if not side or any(isinstance(v, bool) or not isinstance(v, numbers.Integral)
                               or v < 1 for v in side):  # fmt: skip
                raise ValueError(f"modes[{pattern!r}] must list integers >= 1, got {side!r}")
        if len(n_in) != len(n_out):
            raise ValueError(f"modes[{pattern!r}]: 'in' and 'out' need the same number of "
                             f"modes, got {len(n_in)} and {len(n_out)}")  # fmt: skip
        out.append((pattern, tuple(int(v) for v in n_in), tuple(int(v) for v in n_out)))
    return tuple(out)


@dataclass(frozen=True)
class TensorizeReport:
    """Names built as TT / TTM, and the tensorizable layers left dense with the reason."""

    tensorized: tuple[str, ...] = ()
    skipped: tuple[SkippedLayer, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"tensorized": list(self.tensorized),
                "skipped": [s.to_dict() for s in self.skipped]}  # fmt: skip


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
        kw = {"max_rank": options.max_rank, "gate_threshold": options.gate_threshold,
              "d": options.d, **extra}  # fmt: skip
        return TTLinear(slot.n_in, slot.n_out, bias, **kw)
    if not tt:
        return nn.Embedding(slot.n_in, slot.n_out)
    kw = {"max_rank": options.embedding_rank, "gate_threshold": options.gate_threshold,
          "d": options.d, **extra}  # fmt: skip
    return TTMEmbedding(slot.n_in, slot.n_out, **kw)


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
        for pattern in options.layers:
            if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in slots):
                raise ValueError(
                    f"layers: pattern {pattern!r} matches no tensorizable layer of "
                    f"{type(model).__name__}; candidates are {[n for n, _ in slots]}"
                )
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
        if explicit is not None:  # the user's factorization replaces the architecture's
            keys = (
                ("in_modes", "out_modes") if slot.kind == "linear" else ("row_modes", "col_modes")
            )
            extra = {k: v for k, v in extra.items() if k not in ("ranks", *keys)}
            extra.update(zip(keys, explicit, strict=True))
        try:
            layer = _build(slot, reason is None, options, extra)
        except ValueError as err:
            given = "modes: the modes given do not fit; " if explicit is not None else ""
            raise ValueError(f"{given}cannot tensorize {name!r}: {err}") from err
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer)
        if reason is None:
            done.append(name)
        else:
            skipped.append(SkippedLayer(name, slot.kind, reason))
    for pattern, _, _ in options.modes if tensorized else ():
        if not any(fnmatch.fnmatchcase(n, pattern) for n in done):
            raise ValueError(f"modes: pattern {pattern!r} matches no tensorized layer; "
                             f"tensorized are {done}")  # fmt: skip
    report = TensorizeReport(tuple(done), tuple(skipped))
    model.tensorize_report = report
    return report


def tensorize_report(model: nn.Module) -> TensorizeReport | None:
    """The report :func:`materialize` attached to ``model`` (``None`` if it never ran)."""
    report = getattr(model, "tensorize_report", None)
    return report if isinstance(report, TensorizeReport) else None

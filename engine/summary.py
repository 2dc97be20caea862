"""What :func:`engine.compress.compress_` did: one row per replaced layer, plus totals.

Counts are exact and come from the new modules themselves (``tt_parameters()``,
``dense_parameters()``), so a summary always agrees with the model it describes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

__all__ = ["LayerSummary", "SkippedLayer", "CompressionSummary"]


@dataclass(frozen=True)
class LayerSummary:
    """One replaced layer.

    For ``kind == "linear"`` the modes are ``in_modes`` / ``out_modes`` and ``padding`` is
    ``(padded_in - in_features, padded_out - out_features)``. For ``kind == "embedding"`` they
    hold ``row_modes`` / ``col_modes`` and ``padding`` is ``(padded_rows - num_embeddings, 0)``.
    """

    name: str
    kind: str
    in_modes: tuple[int, ...]
    out_modes: tuple[int, ...]
    ranks: tuple[int, ...]
    dense_params: int  # weight entries of the layer it replaced (bias excluded)
    tt_params: int  # TT / TTM core entries (gates and bias excluded)
    gate_params: int
    padding: tuple[int, int]

    @property
    def ratio(self) -> float:
        return math.inf if self.tt_params == 0 else self.dense_params / self.tt_params

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in ("in_modes", "out_modes", "ranks", "padding"):
            out[key] = list(out[key])
        out["ratio"] = self.ratio
        return out


@dataclass(frozen=True)
class SkippedLayer:
    """A Linear / Embedding that stayed dense, and why."""

    name: str
    kind: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CompressionSummary:
    """Rows for the replaced layers, the candidates left dense, and whole-model counts."""

    layers: tuple[LayerSummary, ...] = ()
    skipped: tuple[SkippedLayer, ...] = ()
    model_params_before: int = 0
    model_params_after: int = 0
    config: dict = field(default_factory=dict)

    @property
    def dense_params(self) -> int:
        return sum(row.dense_params for row in self.layers)

    @property
    def tt_params(self) -> int:
        return sum(row.tt_params for row in self.layers)

    @property
    def gate_params(self) -> int:
        return sum(row.gate_params for row in self.layers)

    @property
    def ratio(self) -> float:
        """Dense weight entries over core entries, replaced layers only."""
        return math.inf if self.tt_params == 0 else self.dense_params / self.tt_params

    @property
    def model_ratio(self) -> float:
        """Whole-model parameters before over after (gates, biases, everything counted)."""
        after = self.model_params_after
        return math.inf if after == 0 else self.model_params_before / after

    def to_dict(self) -> dict:
        return {
            "layers": [row.to_dict() for row in self.layers],
            "skipped": [row.to_dict() for row in self.skipped],
            "totals": {
                "layers": len(self.layers),
                "dense_params": self.dense_params,
                "tt_params": self.tt_params,
                "gate_params": self.gate_params,
                "ratio": self.ratio,
                "model_params_before": self.model_params_before,
                "model_params_after": self.model_params_after,
                "model_ratio": self.model_ratio,
            },
            "config": self.config,
        }

    def __str__(self) -> str:
        head = ("layer", "kind", "modes (in | out)", "ranks", "pad", "dense", "tt", "ratio")
        rows = [
            (
                row.name,
                row.kind,
                f"{list(row.in_modes)} | {list(row.out_modes)}",
                "-".join(map(str, row.ranks)),
                f"{row.padding[0]},{row.padding[1]}",
                f"{row.dense_params:,}",
                f"{row.tt_params:,}",
                f"{row.ratio:.1f}x",
            )
            for row in self.layers
        ]
        total = (
            f"total ({len(self.layers)})",
            "",
            "",
            "",
            "",
            f"{self.dense_params:,}",
            f"{self.tt_params:,}",
            f"{self.ratio:.1f}x",
        )
        widths = [max(len(r[i]) for r in [head, *rows, total]) for i in range(len(head))]
        right = {5, 6, 7}  # numeric columns

        def line(cells: tuple[str, ...]) -> str:
            parts = [
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(parts).rstrip()

        rule = "  ".join("-" * w for w in widths)
        out = [line(head), rule, *map(line, rows), rule, line(total)]
        out.append(
            f"model parameters: {self.model_params_before:,} -> {self.model_params_after:,} "
            f"({self.model_ratio:.1f}x); gates {self.gate_params:,}"
        )
        if self.skipped:
            out.append(f"left dense ({len(self.skipped)}):")
            out.extend(f"  {s.name} ({s.kind}): {s.reason}" for s in self.skipped)
        return "\n".join(out)

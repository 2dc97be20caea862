"""A multilayer perceptron classifier for tabular or image arrays, dense or tensorized.

``x (B, F)`` (or ``(B, ...)`` with ``prod(...) = F``, flattened) passes through the hidden
linears ``F -> h_1 -> ... -> h_L``, each followed by the activation (GELU or ReLU) and dropout,
then the output linear ``h_L -> C`` gives the logits. The hidden linears (``hidden.<i>``) are
the tensorizable layers (``TTLinear`` when tensorized, see :mod:`engine.models.tensorize`);
the output linear ``out`` always stays dense, as the transformer's final classifier does.

:class:`MLPStack` (a ``ModuleList`` of linears with a functional activation, so its layers
are named ``<stack>.<i>``) is shared with :mod:`engine.models.dlrm`.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.tensorize import TensorizeOptions, TensorizeReport, linear_slot, materialize

__all__ = ["MLPConfig", "MLPStack", "MLPClassifier", "build_mlp", "ACTIVATIONS"]

CONFIG_VERSION = 1
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"gelu": F.gelu, "relu": F.relu}
MakeLinear = Callable[[int, int], nn.Module]  # (in, out) -> module


# -- config field checks (shared with dlrm.py) ----------------------------------------------
def check_int(value: object, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_widths(value: object, name: str, *, allow_empty: bool) -> tuple[int, ...]:
    """A tuple of positive integers (lists from JSON are accepted)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a list of integers >= 1, got {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a list of integers >= 1, got {value!r}")
    return tuple(int(v) for v in value)


def config_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """``cls(**data)`` after rejecting unknown keys and requiring ``version``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}")
    if "version" not in data:
        raise ValueError(f"{cls.__name__}: version is required")
    return cls(**data)


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of the classifier; the defaults fit flattened 28 x 28 images with 10 classes."""

    in_features: int = 784
    hidden: tuple[int, ...] = (512, 512)
    num_classes: int = 10
    activation: str = "gelu"
    dropout: float = 0.1
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"version must be {CONFIG_VERSION}, got {self.version!r}")
        check_int(self.in_features, "in_features")
        check_int(self.num_classes, "num_classes")
        object.__setattr__(self, "hidden", check_widths(self.hidden, "hidden", allow_empty=False))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                             f"got {self.activation!r}")
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
            raise ValueError(f"dropout must be in [0, 1), got {p!r}")

    @classmethod
    def tiny(cls, **changes: Any) -> MLPConfig:
        """A small model for tests and smoke runs."""
        return cls(**{"in_features": 48, "hidden": (64, 32), "num_classes": 5, **changes})

    def replace(self, **changes: Any) -> MLPConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hidden"] = list(self.hidden)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MLPConfig:
        return config_from_dict(cls, data)


class MLPStack(nn.ModuleList):
    """Linears ``widths[0] -> widths[1] -> ...``, activation and dropout after each.

    ``last_activation=False`` leaves the last linear's output raw (logits).
    """

    def __init__(
        self,
        widths: Sequence[int],
        make_linear: MakeLinear | None = None,
        *,
        activation: str = "relu",
        last_activation: bool = True,
        dropout: float = 0.0,
    ) -> None:
        make_linear = make_linear or (lambda n_in, n_out: nn.Linear(n_in, n_out))
        super().__init__([make_linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)])
        self.act = ACTIVATIONS[activation]
        self.last_activation = last_activation
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        n = len(self)
        for i, layer in enumerate(self):
            x = layer(x)  # (B, w_{i+1})
            if i < n - 1 or self.last_activation:
                x = F.dropout(self.act(x), self.dropout, self.training)  # (B, w_{i+1})
        return x


class MLPClassifier(nn.Module):
    """``x (B, F) or (B, ...) -> logits (B, C)``."""

    def __init__(self, config: MLPConfig, make_linear: MakeLinear | None = None) -> None:
        super().__init__()
        self.config = config
        widths = (config.in_features, *config.hidden)
        self.hidden = MLPStack(widths, make_linear, activation=config.activation,
                               dropout=config.dropout)  # fmt: skip
        self.out = nn.Linear(widths[-1], config.num_classes)  # always dense

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"x must be (B, F) or (B, ...), got shape {tuple(x.shape)}")
        x = x.flatten(1)  # (B, F)
        if x.shape[1] != self.config.in_features:
            raise ValueError(f"x has {x.shape[1]} features per row, expected in_features="
                             f"{self.config.in_features}")
        return self.out(self.hidden(x))  # (B, C)


def build_mlp(
    config: MLPConfig,
    *,
    tensorized: bool,
    max_rank: int = 30,
    embedding_max_rank: int | None = None,
    gate_threshold: float = 1e-2,
    d: int | None = None,
    layers: Sequence[str] = ("*",),
    min_size: int = 1024,
    modes: Any = (),
) -> MLPClassifier:
    """Dense model, or the hidden linears (``hidden.<i>``) as ``TTLinear`` (random init).

    Options as :class:`~engine.models.tensorize.TensorizeOptions`; ``embedding_max_rank`` is
    accepted for a uniform signature and unused (the MLP has no embedding).
    """
    if not tensorized:
        model = MLPClassifier(config)
        model.tensorize_report = TensorizeReport()
        return model
    options = TensorizeOptions(
        max_rank=max_rank, embedding_max_rank=embedding_max_rank, gate_threshold=gate_threshold,
        d=d, layers=layers, min_size=min_size, modes=modes,
    )  # fmt: skip
    model = MLPClassifier(config, lambda n_in, n_out: linear_slot(n_in, n_out))
    materialize(model, options)
    return model

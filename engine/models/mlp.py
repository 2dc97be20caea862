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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from engine.configs import ConfigMethods, spec, validate
from engine.models.limits import MAX_CLASSES, MAX_HIDDEN_LAYERS, MAX_IN_FEATURES, MAX_WIDTH
from engine.models.tensorize import TensorizeOptions, build_model, linear_slot
from engine.nn.dropout import dropout as drop

__all__ = ["MLPConfig", "MLPStack", "MLPClassifier", "build_mlp", "ACTIVATIONS"]

CONFIG_VERSION = 1
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"gelu": F.gelu, "relu": F.relu}
MakeLinear = Callable[[int, int], nn.Module]  # (in, out) -> module


@dataclass(frozen=True)
class MLPConfig(ConfigMethods):
    """Sizes of the classifier; the defaults fit flattened 28 x 28 images with 10 classes."""

    REQUIRED = ("version",)

    in_features: int = spec(784, ge=1, le=MAX_IN_FEATURES)
    hidden: tuple[int, ...] = spec((512, 512), ge=1, le=MAX_WIDTH, length=(1, MAX_HIDDEN_LAYERS))
    num_classes: int = spec(10, ge=1, le=MAX_CLASSES)
    activation: str = spec("gelu", choices=tuple(sorted(ACTIVATIONS)))
    dropout: float = spec(0.1, ge=0, lt=1)
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def tiny(cls, **changes: Any) -> MLPConfig:
        """A small model for tests and smoke runs."""
        return cls(**{"in_features": 48, "hidden": (64, 32), "num_classes": 5, **changes})


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
                x = drop(self.act(x), self.dropout, self.training)  # (B, w_{i+1})
        return x


class MLPClassifier(nn.Module):
    """``x (B, F) or (B, ...) -> logits (B, C)``."""

    def __init__(self, config: MLPConfig, make_linear: MakeLinear | None = None) -> None:
        super().__init__()
        self.config = config
        widths = (config.in_features, *config.hidden)
        self.hidden = MLPStack(
            widths, make_linear, activation=config.activation, dropout=config.dropout
        )
        self.out = nn.Linear(widths[-1], config.num_classes)  # always dense

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"x must be (B, F) or (B, ...), got shape {tuple(x.shape)}")
        x = x.flatten(1)  # (B, F)
        if x.shape[1] != self.config.in_features:
            raise ValueError(
                f"x has {x.shape[1]} features per row, expected in_features="
                f"{self.config.in_features}"
            )
        return self.out(self.hidden(x))  # (B, C)


def build_mlp(
    config: MLPConfig,
    *,
    tensorized: bool,
    options: TensorizeOptions | None = None,
) -> MLPClassifier:
    """Dense model, or the hidden linears (``hidden.<i>``) as ``TTLinear`` (random init).

    ``options`` (default :class:`~engine.models.tensorize.TensorizeOptions`; automatic shapes,
    ``embedding_max_rank`` unused: the MLP has no embedding).
    """
    slots = (lambda n_in, n_out: linear_slot(n_in, n_out),)
    return build_model(MLPClassifier, config, tensorized=tensorized, options=options, slots=slots)

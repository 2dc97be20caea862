"""The contract between a model family and the trainer: :class:`Workload` and its helpers.

A :class:`Workload` ties a model family to the trainer without the trainer knowing its
internals: it builds the model (dense or tensorized) from a config dict, and turns a batch
(a dict of tensors, keys in ``batch_keys``) into a task loss plus metric sums. Metric sums are
additive over batches (``count``, ``loss_sum``, ``correct``, ...); :meth:`Workload.summarize`
turns accumulated sums into the reported metrics (``loss``, ``accuracy``, ...).
:meth:`Workload.example_batch` draws a random valid batch (tests, benchmarks).
:func:`register_workload` (a class decorator) puts one instance of a workload in ``WORKLOADS``
under its ``name``; the built-in workloads are registered by :mod:`engine.models.registry`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.configs import ConfigError, parse
from engine.models.tensorize import TensorizeOptions

__all__ = [
    "StepOutput",
    "Workload",
    "WORKLOADS",
    "register_workload",
    "classification_output",
    "example_lengths",
    "seq_len_of",
]


@dataclass
class StepOutput:
    """Task loss of one batch (mean, attached to the graph) and additive metric sums."""

    loss: Tensor  # () mean task loss
    sums: dict[str, Tensor]  # () each, detached: count, loss_sum, correct, ...


def classification_output(logits: Tensor, labels: Tensor) -> StepOutput:
    """Cross-entropy over ``logits (B, C)`` with ``labels (B,)``; sums for loss and accuracy."""
    loss = F.cross_entropy(logits, labels)  # ()
    with torch.no_grad():
        n = torch.tensor(float(labels.numel()), device=logits.device)
        correct = (logits.argmax(-1) == labels).sum().to(logits.dtype)  # ()
    return StepOutput(loss, {"count": n, "loss_sum": loss.detach() * n, "correct": correct})


def _compression_error(err: ValueError) -> ConfigError:
    """A build error under ``compression``: a ``ConfigError`` keeps its field (re-rooted;
    one already about ``model.config`` stays there), anything else is about the
    compression settings as a whole."""
    if isinstance(err, ConfigError):
        return err if err.field.startswith("model.config.") else err.under("compression")
    return ConfigError("compression", str(err))


def example_lengths(batch: int, seq: int, g: torch.Generator | None) -> Tensor:
    """Random valid lengths in ``[max(1, seq // 2), seq]``, one row at full length."""
    lo = max(1, seq // 2)
    n = torch.randint(lo, seq + 1, (batch,), generator=g)  # (B,)
    n[0] = seq
    return n


class Workload:
    """Base class: subclasses set ``name``, ``config_cls``, ``batch_keys`` and override."""

    name: str = ""
    config_cls: type = object
    batch_keys: tuple[str, ...] = ()
    paper_shapes: bool = False  # whether compression.shapes="paper" means something here
    guard_metric: str = "accuracy"  # the validation metric the fidelity guard watches
    # layers with a residual path around them: only these may be pruned to rank 0
    bypassed: tuple[str, ...] = ()

    # -- config and model -------------------------------------------------------------------
    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        """The config dataclass from ``model.config``; errors name ``model.config.<field>``."""
        if not isinstance(data, Mapping):
            raise ConfigError("model.config", f"must be a mapping, got {type(data).__name__}")
        return parse(self.config_cls, {"version": 1, **data}, "model.config")

    def _config(self, config: Any) -> Any:
        if isinstance(config, Mapping):
            return self.config_from_dict(config)
        if not isinstance(config, self.config_cls):
            raise TypeError(
                f"model.config must be a {self.config_cls.__name__} or a mapping, "
                f"got {type(config).__name__}"
            )
        return config

    def build(self, config: Any, *, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        """The model, dense or tensorized; ``model.tensorize_report`` lists the layer choices."""
        config = self._config(config)
        if not isinstance(options, TensorizeOptions):
            raise TypeError(f"options must be TensorizeOptions, got {type(options).__name__}")
        if tensorized and options.shapes == "paper" and not self.paper_shapes:
            raise ConfigError(
                "compression.shapes",
                f"'paper' is defined only for the transformer "
                f"(the paper's MNLI shapes); use 'auto' for arch {self.name!r}",
            )
        try:
            return self._build(config, tensorized, options)
        except ValueError as err:
            if not tensorized:
                raise
            raise _compression_error(err) from None

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        raise NotImplementedError

    # -- data and loss ----------------------------------------------------------------------
    def example_batch(
        self,
        config: Any,
        batch_size: int,
        generator: torch.Generator | None = None,
        *,
        seq_len: int | None = None,
    ) -> dict[str, Tensor]:
        """A random valid CPU batch (``seq_len`` only for sequence models; default 16)."""
        config = self._config(config)
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, numbers.Integral)
            or (batch_size < 1)
        ):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return self._example(config, int(batch_size), generator, seq_len)

    def _example(
        self, config: Any, b: int, g: torch.Generator | None, seq_len: int | None
    ) -> dict[str, Tensor]:
        raise NotImplementedError

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        raise NotImplementedError

    def manifest_config(self, config: Any) -> dict[str, Any]:
        """The ``model_config`` an export records: what rebuilds the architecture."""
        return self._config(config).to_dict()

    def upgrade_checkpoint(
        self, manifest: Mapping[str, Any], tensors: Mapping[str, Tensor]
    ) -> tuple[Mapping[str, Any], Mapping[str, Tensor]]:
        """A checkpoint written by an earlier version of this workload, under today's names
        (``engine.export.load_compressed`` calls it before it builds). Default: unchanged."""
        return manifest, tensors

    def guard_metric_of(self, config: Any) -> str:
        """The validation metric the fidelity guard watches for ``config`` (higher is better)."""
        return self.guard_metric

    def plan_config(self, config: Any) -> Any:
        """The config a dry-run plan builds on the ``meta`` device (shapes, no weights read).
        Default: ``config`` itself."""
        return self._config(config)

    def prepare(
        self, model: nn.Module, batches: Iterable[Mapping[str, Tensor]], *, device: torch.device
    ) -> dict[str, Any] | None:
        """Data-dependent set-up of a freshly built model before its first step (the trainer
        passes the training batches of epoch 0; not called on resume). Default: nothing."""
        return None

    def setup(
        self, model: nn.Module, train: Any, job: Any, *, device: torch.device
    ) -> dict[str, Any] | None:
        """Set-up outside the model's state before the first step, the same for a fresh and
        a resumed run (``train``: the training source; ``job``: the job config); what it did,
        for the report. Default: nothing."""
        return None

    def label_counts(self, batch: Mapping[str, Tensor]) -> Tensor | None:
        """Histogram (C,) of the labels a batch is scored on (the chance level); None when
        the task has no classes."""
        labels = batch.get("labels")
        if labels is None or labels.dtype != torch.long:
            return None
        return torch.bincount(labels[labels >= 0].flatten())

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Reported metrics from accumulated sums: mean ``loss`` and ``accuracy``."""
        n = max(sums.get("count", 0.0), 1.0)
        out = {"loss": sums.get("loss_sum", 0.0) / n}
        if "correct" in sums:
            out["accuracy"] = sums["correct"] / n
        return out


def seq_len_of(config: Any, seq_len: int | None) -> int:
    s = min(config.max_len, 16) if seq_len is None else seq_len
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= s <= config.max_len:
        raise ValueError(f"seq_len must be an integer in [1, {config.max_len}], got {s!r}")
    return int(s)


W = TypeVar("W", bound=type[Workload])
WORKLOADS: dict[str, Workload] = {}  # name -> the workload (registration order)


def register_workload(cls: W) -> W:
    """Register one instance of the Workload subclass ``cls`` under ``cls.name`` (the shape of
    torchao's ``register_quantize_module_handler``): a class decorator, or a plain call for a
    class defined elsewhere. A name registers once."""
    if not (isinstance(cls, type) and issubclass(cls, Workload)) or not cls.name:
        raise TypeError(f"register_workload takes a Workload subclass with a name, got {cls!r}")
    if cls.name in WORKLOADS:
        raise ValueError(f"workload {cls.name!r} is already registered")
    WORKLOADS[cls.name] = cls()
    return cls

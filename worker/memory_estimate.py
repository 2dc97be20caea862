"""The peak memory a job needs, estimated from its model (built on the ``meta`` device) and the
real sizes of its data (:mod:`worker.data_facts`).

Three parts, in bytes:

* **model**: every trainable parameter costs 16 (fp32 weight, gradient and two Adam moments),
  every frozen one 4 (the teacher of a distilled model);
* **activations**: 2 x 4 bytes x tokens per batch x the summed output widths of every linear
  and embedding layer (the output and one same-size intermediate kept for backward), plus for
  attention models 2 x 4 bytes x batch x heads x seq^2 x layers (scores and probabilities);
  tokens per batch are ``batch_size x seq_len`` for sequence models, ``batch_size`` otherwise;
* **data**: what the loader holds (generated data sets whole, a file's shuffle buffer, a
  compressed Fortran-ordered array read whole, a tokenizer's word counts), from the facts.

A data-parallel job (``training.devices`` x ``training.nodes`` = W processes, one per device)
is estimated per process, which is what each device and each process's memory cap must hold:
the whole model and its optimizer state (every process keeps a replica) plus DDP's gradient
buckets (4 bytes per trainable parameter), the activations of the process's slice of the
global batch (``batch_size / W`` rows) and the data (every process builds the global batches
itself, so it holds the data as a single process does). ``processes`` says how many there are.

A job whose total is over the worker's capacity (``COMERA_WORKER_MEMORY_BYTES``) is refused
(``worker.plan_checks.check_capacity``); the worker runs each job under a hard cap of the same
size (``worker.memory_cap``), so an estimate that falls short ends the job as ``oom``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.job import JobConfig

__all__ = ["SEQUENCE_ARCHS", "MemoryEstimate", "estimate_memory", "processes"]

SEQUENCE_ARCHS = ("transformer", "mlm", "hf_bert")


@dataclass(frozen=True)
class MemoryEstimate:
    model_bytes: int
    activation_bytes: int
    data_bytes: int
    processes: int = 1  # data-parallel processes, each needing ``total`` (module doc)

    @property
    def total(self) -> int:
        return self.model_bytes + self.activation_bytes + self.data_bytes

    def to_dict(self) -> dict[str, int]:
        return {
            "model_bytes": self.model_bytes,
            "activation_bytes": self.activation_bytes,
            "data_bytes": self.data_bytes,
            "processes": self.processes,
        }


def processes(cfg: JobConfig) -> int:
    """Data-parallel processes of the job: ``training.devices`` x ``training.nodes``."""
    return cfg.training.devices * cfg.training.nodes


def _activation_bytes(model: nn.Module, cfg: JobConfig, model_config: Any) -> int:
    batch, seq = cfg.training.batch_size // processes(cfg), 1  # one process's rows
    if cfg.model.arch in SEQUENCE_ARCHS:
        seq = min(cfg.data.max_len, getattr(model_config, "max_len", cfg.data.max_len))
    widths = 0
    for m in model.modules():
        if isinstance(m, nn.Linear | TTLinear):
            widths += m.out_features
        elif isinstance(m, nn.Embedding | TTMEmbedding):
            widths += m.embedding_dim
    out = 2 * 4 * batch * seq * widths
    if cfg.model.arch in SEQUENCE_ARCHS:
        heads = getattr(model_config, "n_heads", 0) or 0
        layers = getattr(model_config, "n_layers", 0) or 0
        out += 2 * 4 * batch * heads * seq * seq * layers
    return out


def estimate_memory(
    model: nn.Module, cfg: JobConfig, model_config: Any, data_bytes: int
) -> MemoryEstimate:
    """The estimate for ``model`` (as it trains: tensorized when the job is) and its data, per
    process of a data-parallel job (module doc)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    world = processes(cfg)
    buckets = 4 * trainable if world > 1 else 0  # DDP's gradient buckets
    return MemoryEstimate(
        model_bytes=16 * trainable + 4 * frozen + buckets,
        activation_bytes=_activation_bytes(model, cfg, model_config),
        data_bytes=data_bytes,
        processes=world,
    )

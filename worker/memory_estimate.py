"""The peak memory a job needs, estimated from its model (built on the ``meta`` device) and the
real sizes of its data (:mod:`worker.data_facts`).

Three parts, in bytes:

* **model**: every trainable parameter costs 16 (fp32 weight, gradient and two Adam moments),
  every frozen one 4 (the teacher of a distilled model, the frozen original of a pretrained
  ``hf`` model); a job whose late or finetune stages
  distil from the stage-start model (:mod:`engine.train.teacher`) holds a frozen copy of the
  model, 4 bytes per parameter (an upper bound: ranks only fall before a late stage);
* **activations**: 2 x 4 bytes x tokens per batch x the summed output widths of every linear
  and embedding layer (the output and one same-size intermediate kept for backward), plus for
  attention models 2 x 4 bytes x batch x heads x seq^2 x layers (scores and probabilities);
  tokens per batch are ``batch_size x seq_len`` for sequence models, ``batch_size`` otherwise;
  the stage-start teacher's forward runs without a graph and adds its widest layer's input
  and output (and one layer's attention scores);
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

from engine.models.registry import get_workload
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.job import JobConfig
from engine.train.teacher import teacher_weight

__all__ = ["SEQUENCE_ARCHS", "MemoryEstimate", "estimate_memory", "has_teacher", "processes"]

SEQUENCE_ARCHS = ("transformer", "mlm", "hf_bert", "hf")
HF_HEADS = ("num_attention_heads", "n_head", "n_heads")  # config.json names per family
HF_LAYERS = ("num_hidden_layers", "n_layer", "n_layers")


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


def has_teacher(cfg: JobConfig) -> bool:
    """Whether a stage of the job distils from the stage-start model."""
    workload, guard_on = get_workload(cfg.model.arch), cfg.compression.max_metric_drop is not None
    return cfg.tensorized and any(
        s.kind == "late" and teacher_weight(s, workload, guard_on) > 0 for s in cfg.schedule
    )


def _attention(model_config: Any) -> tuple[int, int]:
    """Heads and layers of a sequence model (an ``hf`` model's from its ``config.json``)."""
    heads = getattr(model_config, "n_heads", 0) or 0
    layers = getattr(model_config, "n_layers", 0) or 0
    config_json = getattr(model_config, "config_json", None)  # the hf workload
    if isinstance(config_json, dict):
        heads = next((config_json[k] for k in HF_HEADS if config_json.get(k)), 0)
        layers = next((config_json[k] for k in HF_LAYERS if config_json.get(k)), 0)
    return int(heads), int(layers)


def _activation_bytes(model: nn.Module, cfg: JobConfig, model_config: Any) -> int:
    batch, seq = cfg.training.batch_size // processes(cfg), 1  # one process's rows
    if cfg.model.arch in SEQUENCE_ARCHS:
        seq = min(cfg.data.max_len, getattr(model_config, "max_len", None) or cfg.data.max_len)
    widths, widest = 0, 0
    for m in model.modules():
        width = 0
        if isinstance(m, nn.Linear | TTLinear):
            width = m.out_features
        elif isinstance(m, nn.Embedding | TTMEmbedding):
            width = m.embedding_dim
        widths, widest = widths + width, max(widest, width)
    out = 2 * 4 * batch * seq * widths
    heads = layers = 0
    if cfg.model.arch in SEQUENCE_ARCHS:
        heads, layers = _attention(model_config)
        out += 2 * 4 * batch * heads * seq * seq * layers
    if has_teacher(cfg):  # no graph: one layer's input and output, one layer's scores
        out += 2 * 4 * batch * seq * widest + 4 * batch * heads * seq * seq
    return out


def estimate_memory(
    model: nn.Module, cfg: JobConfig, model_config: Any, data_bytes: int, *, teacher_params: int = 0
) -> MemoryEstimate:
    """The estimate for ``model`` (as it trains: tensorized when the job is) and its data, per
    process of a data-parallel job (module doc); ``teacher_params``: the frozen original a
    pretrained ``hf`` model distils from, held outside the model."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = teacher_params + sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if has_teacher(cfg):  # the stage-start teacher: a frozen copy of the whole model
        frozen += sum(p.numel() for p in model.parameters())
    world = processes(cfg)
    buckets = 4 * trainable if world > 1 else 0  # DDP's gradient buckets
    return MemoryEstimate(
        model_bytes=16 * trainable + 4 * frozen + buckets,
        activation_bytes=_activation_bytes(model, cfg, model_config),
        data_bytes=data_bytes,
        processes=world,
    )

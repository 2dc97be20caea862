"""The peak memory a job needs, estimated from its model (built on the ``meta`` device), the
real sizes of its data (:mod:`worker.data_facts`) and what every process of this host holds
before either (:mod:`worker.process_baseline`).

Five parts, in bytes, per process:

* **model**: every trainable parameter costs 16 (fp32 weight, gradient and two Adam moments),
  every frozen one 4. A teacher held outside the model is frozen and float32:
  ``teacher_params``, the original a pretrained ``hf`` or ``hf_bert`` model distils from
  (:func:`worker.plan.plan_job` counts the dense model's parameters), and the stage-start
  teacher of a job whose late or finetune stages distil from it (:mod:`engine.train.teacher`;
  a frozen copy of the model, an upper bound: ranks only fall before a late stage). A late
  stage under the fidelity guard (``compression.max_metric_drop``, :mod:`engine.train.guard`)
  keeps a host copy of the model's state and Adam's moments (4 bytes per parameter of the
  model, 8 per trainable one), twice: a new snapshot is built before the last is released;
* **activations**: 2 x 4 bytes x tokens per batch x the summed output widths of every linear
  and embedding layer (the output and one same-size intermediate kept for backward), plus for
  attention models 2 x 4 bytes x batch x heads x seq^2 x layers (scores and probabilities);
  tokens per batch are ``batch_size x seq_len`` for sequence models, ``batch_size`` otherwise.
  A teacher's forward runs in inference mode, without a graph: its widest layer's input and
  output and one layer's attention scores;
* **data**: what the loader holds (generated data sets whole, a file's shuffle buffer, a
  compressed Fortran-ordered array read whole, a tokenizer's word counts), from the facts,
  plus ``hf_bert``'s table of teacher embeddings (``distill: cosine_embedding``: 4 bytes x
  hidden size a training sentence, at most ``engine.models.hf_bert.cache.MAX_BYTES``; ``hf``
  sentence embeddings alike);
* **baseline**: the process itself: its interpreter, torch, the engine and what their first
  step loads, as measured on this host (``process_bytes``; ``hf_bytes`` more for the ``hf``
  and ``hf_bert`` workloads, on transformers' classes);
* **slack**: :data:`RUNTIME_SLACK` for what a job loads beyond the probe's (its data
  pipeline's modules, thread and allocator arenas) and :data:`FRAGMENTATION` of the model,
  activations and data (freed blocks the allocator keeps: a tiny BERT's peak measured up to
  5% above the four parts, varying by that much from run to run).

A data-parallel job (``training.devices`` x ``training.nodes`` = W processes, one per device)
is estimated per process, which is what each device and each process's memory cap must hold:
the baseline, the whole model and its optimizer state (every process keeps a replica) plus
DDP's gradient buckets (4 bytes per trainable parameter), the activations of the process's
slice of the global batch (``batch_size / W`` rows) and the data (every process builds the
global batches itself, so it holds the data as a single process does). ``processes`` says how
many there are; ``launcher_bytes`` is the launcher beside them (``torchrun``'s, measured, plus
the slack; 0 for one process), held once per job and not part of ``total``.

A job whose total is over the worker's capacity (``COMERA_WORKER_MEMORY_BYTES``) is refused
(``worker.plan_checks.check_capacity``); the worker runs each job under a hard cap of the same
size (``worker.memory_cap``), so an estimate that falls short ends the job as ``oom``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from engine.models.hf_bert.cache import MAX_BYTES as TEACHER_TABLE_MAX_BYTES
from engine.models.registry import get_workload
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.job import JobConfig
from engine.train.teacher import teacher_weight
from worker.process_baseline import DEFAULT_BASELINE, ProcessBaseline

__all__ = [
    "FRAGMENTATION",
    "RUNTIME_SLACK",
    "SEQUENCE_ARCHS",
    "MemoryEstimate",
    "estimate_memory",
    "has_teacher",
    "processes",
]

SEQUENCE_ARCHS = ("transformer", "mlm", "hf_bert", "hf")
# the workloads built on transformers' modeling classes: their process imports transformers
TRANSFORMERS_ARCHS = ("hf_bert", "hf")
HF_HEADS = ("num_attention_heads", "n_head", "n_heads")  # config.json names per family
HF_LAYERS = ("num_hidden_layers", "n_layer", "n_layers")
RUNTIME_SLACK = 32 << 20  # a job's process beyond the baseline probe's (module doc)
FRAGMENTATION = 1 / 8  # of the model, activations and data (module doc)


@dataclass(frozen=True)
class MemoryEstimate:
    model_bytes: int
    activation_bytes: int
    data_bytes: int
    baseline_bytes: int = 0  # the process itself (module doc)
    slack_bytes: int = 0
    processes: int = 1  # data-parallel processes, each needing ``total`` (module doc)
    launcher_bytes: int = 0  # the launcher beside them, once per job; not in ``total``

    @property
    def total(self) -> int:
        parts = self.model_bytes + self.activation_bytes + self.data_bytes
        return parts + self.baseline_bytes + self.slack_bytes

    @property
    def job_bytes(self) -> int:
        """What the whole job holds on its machines: every process and the launcher."""
        return self.processes * self.total + self.launcher_bytes

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


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
    """Heads and layers of a sequence model (an ``hf`` model's from its ``config.json``, an
    ``hf_bert`` model's from its architecture)."""
    heads = getattr(model_config, "n_heads", 0) or 0
    layers = getattr(model_config, "n_layers", 0) or 0
    arch = getattr(model_config, "arch", None)  # hf_bert
    if hasattr(arch, "num_attention_heads"):
        heads, layers = arch.num_attention_heads, arch.num_hidden_layers
    config_json = getattr(model_config, "config_json", None)  # the hf workload
    if isinstance(config_json, dict):
        heads = next((config_json[k] for k in HF_HEADS if config_json.get(k)), 0)
        layers = next((config_json[k] for k in HF_LAYERS if config_json.get(k)), 0)
    return int(heads), int(layers)


def _activation_bytes(model: nn.Module, cfg: JobConfig, model_config: Any, *, teacher: bool) -> int:
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
    if teacher:  # inference mode: one layer's input and output, one layer's scores
        out += 2 * 4 * batch * seq * widest + 4 * batch * heads * seq * seq
    return out


def _guard_bytes(model: nn.Module, cfg: JobConfig) -> int:
    """The fidelity guard's two snapshots of a late stage (module doc)."""
    if cfg.compression.max_metric_drop is None or not any(s.kind == "late" for s in cfg.schedule):
        return 0
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 2 * (4 * params + 8 * trainable)


def _teacher_table_bytes(cfg: JobConfig, model_config: Any, sentences: int | None) -> int:
    """The teacher's embeddings of the training split, where the loss reads only those:
    ``hf_bert`` with ``cosine_embedding``, a pretrained ``hf`` ``sentence_embedding`` job
    without ``token_weight``."""
    if cfg.model.arch == "hf_bert":
        if getattr(model_config, "distill", None) != "cosine_embedding":
            return 0
        dim = getattr(getattr(model_config, "arch", None), "hidden_size", 0) or 0
    elif cfg.model.arch == "hf":
        if not model_config.pooled_distillation or not cfg.model.config.get("path"):
            return 0
        dim = int(model_config.config_json.get("hidden_size") or 0)
    else:
        return 0
    table = 4 * dim * sentences if sentences is not None else TEACHER_TABLE_MAX_BYTES
    return min(table, TEACHER_TABLE_MAX_BYTES)


def estimate_memory(
    model: nn.Module,
    cfg: JobConfig,
    model_config: Any,
    data_bytes: int,
    *,
    teacher_params: int = 0,
    baseline: ProcessBaseline | None = None,
    train_sentences: int | None = None,
    calibration: nn.Module | None = None,
) -> MemoryEstimate:
    """The estimate for ``model`` (as it trains: tensorized when the job is) and its data, per
    process of a data-parallel job (module doc); ``teacher_params``: the frozen original a
    pretrained ``hf`` / ``hf_bert`` model distils from, held outside the model;
    ``baseline``: this host's (None: :data:`~worker.process_baseline.DEFAULT_BASELINE`);
    ``train_sentences``: the training split's size when known (``hf_bert``'s table);
    ``calibration``: with ``max_rank: "auto"``, the dense twin that every process trains
    alone for the calibration steps before the TT model exists
    (:mod:`engine.train.auto_rank`): the model and activations are those of the larger of
    the two phases."""
    baseline = baseline or DEFAULT_BASELINE
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = teacher_params + sum(p.numel() for p in model.parameters() if not p.requires_grad)
    stage_teacher = has_teacher(cfg)
    if stage_teacher:  # the stage-start teacher: a frozen copy of the whole model
        frozen += sum(p.numel() for p in model.parameters())
    world = processes(cfg)
    buckets = 4 * trainable if world > 1 else 0  # DDP's gradient buckets
    process = baseline.process_bytes
    if cfg.model.arch in TRANSFORMERS_ARCHS:
        process += baseline.hf_bytes
    activations = _activation_bytes(
        model, cfg, model_config, teacher=stage_teacher or teacher_params > 0
    )
    model_bytes = 16 * trainable + 4 * frozen + buckets + _guard_bytes(model, cfg)
    if calibration is not None:  # weights, gradients, AdamW moments; no teacher, no DDP
        dense = 16 * sum(p.numel() for p in calibration.parameters() if p.requires_grad)
        dense_activations = _activation_bytes(calibration, cfg, model_config, teacher=False)
        if dense + dense_activations > model_bytes + activations:
            model_bytes, activations = dense, dense_activations
    data = data_bytes + _teacher_table_bytes(cfg, model_config, train_sentences)
    return MemoryEstimate(
        model_bytes=model_bytes,
        activation_bytes=activations,
        data_bytes=data,
        baseline_bytes=process,
        slack_bytes=RUNTIME_SLACK + int(FRAGMENTATION * (model_bytes + activations + data)),
        processes=world,
        launcher_bytes=baseline.launcher_bytes + RUNTIME_SLACK if world > 1 else 0,
    )

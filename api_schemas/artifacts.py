"""Checkpoints, uploaded datasets, the compression report and the dry-run report."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from api_schemas.common import Page

__all__ = [
    "AttemptPublic",
    "AttemptsPublic",
    "BaselineReport",
    "CheckpointFile",
    "CheckpointManifestPublic",
    "CheckpointPublic",
    "CheckpointsPublic",
    "CompressionReport",
    "DatasetPublic",
    "DatasetsPublic",
    "DistributedExecution",
    "ExecutionReport",
    "FidelityReport",
    "LayerPlan",
    "LayerReport",
    "ModelFilePublic",
    "MemoryPlan",
    "UploadedModelPublic",
    "UploadedModelsPublic",
    "ValidationReport",
]


class CheckpointPublic(BaseModel):
    id: str
    job_id: str
    attempt: int
    # hf, dense: an hf job's Hugging Face directories (model/hf/, model/dense/), one tar each
    kind: Literal["latest", "final", "partial", "export", "hf", "dense"]
    step: int
    stage: str | None = None
    metrics: dict[str, float]
    size_bytes: int | None = None
    sha256: str | None = None
    format: str = "safetensors"
    state: Literal["writing", "complete", "deleted"]
    created_at: datetime
    links: dict[str, str] = {}


class CheckpointsPublic(BaseModel):
    items: list[CheckpointPublic]


class CheckpointFile(BaseModel):
    """One file of a checkpoint: its name inside the checkpoint, size and sha256."""

    name: str
    size_bytes: int | None = None
    sha256: str | None = None


class CheckpointManifestPublic(BaseModel):
    """``GET .../checkpoints/{cid}/manifest``: one sha256 per file, plus the engine manifest
    (``comera-compressed`` format: layers, totals, weights) when the checkpoint has one."""

    checkpoint_id: str
    kind: str
    files: list[CheckpointFile]
    manifest: dict[str, Any] | None = None


class AttemptPublic(BaseModel):
    attempt: int
    worker: str | None = None  # host:pid of the worker that ran it: admin keys only
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_reason: str | None = None  # completed, worker_lost, timeout, oom, error, cancelled
    resume_from: str | None = None


class AttemptsPublic(BaseModel):
    items: list[AttemptPublic]


class DatasetPublic(BaseModel):
    id: str
    name: str
    format: str
    size_bytes: int
    sha256: str
    rows: int | None = None
    state: Literal["ready", "rejected"]
    error: str | None = None
    created_at: datetime


class DatasetsPublic(Page[DatasetPublic]):
    pass


class ModelFilePublic(BaseModel):
    size_bytes: int
    sha256: str


class UploadedModelPublic(BaseModel):
    """``POST /v1/models``: a checked Hugging Face directory; ``sha256`` is that of its files'
    names and sha256s (one ``<name> <sha256>`` line each, sorted by name)."""

    id: str
    name: str
    model_type: str
    size_bytes: int
    sha256: str
    files: dict[str, ModelFilePublic]
    created_at: datetime


class UploadedModelsPublic(Page[UploadedModelPublic]):
    pass


class LayerReport(BaseModel):
    name: str
    kind: str
    modes: dict[str, Any] | list[Any] | None = None
    ranks: list[int]
    dense_params: int
    params: int
    ratio: float | None = None  # null when the layer was cut to rank 0 (no core entries)


class FidelityReport(BaseModel):
    """How closely the exported model follows the original (``hf_bert``): the cosine of the
    two models' mean-pooled sentence embeddings, one per held-out sentence."""

    metric: Literal["cosine"] = "cosine"
    mean: float
    min: float
    sentences: int
    split: str = "valid"  # the held-out sentences: the job's validation split
    measured_on: str = "export"  # the exported file, reloaded


class DeployMeasure(BaseModel):
    """One forward pass of a batch at the table's ``seq_len`` tokens."""

    batch: int
    latency_ms: float  # median of the measured forwards
    tokens_per_second: float
    peak_bytes: int  # CUDA: the allocator's peak; CPU: live tensor storages (a lower bound)


class DeployRow(BaseModel):
    """One model of the deployment table."""

    model_config = ConfigDict(extra="allow")

    metrics: dict[str, float]  # on the validation split (perplexity, accuracy or cosine)
    parameters: int
    file_bytes: int | None = None  # its model.safetensors, when there is one
    batch_1: DeployMeasure
    throughput: DeployMeasure
    kind: str | None = None  # original only: "pretrained" or "densified"


class DeployReport(BaseModel):
    """``hf`` jobs: the exported ``model/hf/`` (as transformers loads it) beside the original,
    measured on the worker's device; ``ratios`` are original / exported (above 1: the
    exported model is smaller, faster or lighter)."""

    seq_len: int
    device: str
    threads: int | None = None
    exported: DeployRow
    original: DeployRow
    ratios: dict[str, float]


class BaselineReport(BaseModel):
    """The newest SUCCEEDED dense job of the same tenant and the same spec (the model, the
    dataset, the training settings but ``log_every``, and the schedule's total steps and
    epochs): its export's metrics and ``deltas = this job's metric - the baseline's`` for
    every metric both have."""

    job_id: str
    metrics: dict[str, float]
    deltas: dict[str, float]


class DistributedExecution(BaseModel):
    """How a data-parallel job ran (``training.devices`` x ``training.nodes`` processes)."""

    world_size: int  # processes, one per device
    backend: str  # the process group's: "gloo" on CPUs, "cpu:gloo,cuda:nccl" with NCCL
    ddp_rebuilds: int  # DistributedDataParallel wrappers built: the first, then after each shrink
    ddp_rebuild_seconds: float  # the time those builds took, in all
    gate_repairs: int = 0  # rank gate entries of a replica that differed from rank 0's


class ExecutionReport(BaseModel):
    """How the steps ran: ``fast_path``, ``precision``, ``cuda_graph`` {mode, used, captures,
    replays, failure}, and ``distributed`` for a data-parallel job (null for one process)."""

    model_config = ConfigDict(extra="allow")

    fast_path: bool | None = None
    precision: str | None = None
    cuda_graph: dict[str, Any] | None = None
    distributed: DistributedExecution | None = None


class CompressionReport(BaseModel):
    """Compression measured on the saved artifact, per layer and in total, plus metrics."""

    job_id: str
    checkpoint_id: str
    file_bytes: int
    dense_bytes: int
    file_ratio: float
    params: int
    params_dense: int
    tensorized_ratio: float | None = None
    model_ratio: float | None = None
    layers: list[LayerReport]
    metrics: dict[str, float]
    stages: list[dict[str, Any]]
    engine_version: str | None = None
    spec_hash: str
    fidelity: FidelityReport | None = None  # hf_bert: agreement with the original model
    deploy: DeployReport | None = None  # hf: model/hf/ beside the original, as deployed
    # the last size target: target_reached, size_target, size_end, ratio_reached (size_end /
    # size at that stage's start) and, when not reached, reason (e.g. the fidelity guard)
    target: dict[str, Any] | None = None
    # the final accuracy against chance: value, majority, uniform, chance, at_chance
    chance: dict[str, Any] | None = None
    # max_rank "auto": the rule, the calibration and each layer's chosen rank (its TT-SVD
    # error, whether the cap held it)
    auto_rank: dict[str, Any] | None = None
    # what the run found to fix, e.g. {"code": "raise_max_rank", "fix": ..., "reason": ...}
    # (codes: raise_max_rank, lower_late_lr, relax_late_target)
    advice: list[dict[str, Any]] | None = None
    baseline: BaselineReport | None = None  # a dense job of the same spec, when one exists
    execution: ExecutionReport | None = None  # how the steps ran (data parallelism included)


class LayerPlan(BaseModel):
    name: str
    kind: str
    shape: list[int]
    modes: dict[str, Any] | list[Any] | None = None
    initial_ranks: list[int]
    dense_params: int
    params: int


class MemoryPlan(BaseModel):
    """The parts of ``estimated_memory_bytes``: the model's weights, gradients and optimizer
    state (a frozen teacher's weights included); activations (a teacher's inference forward
    included); the data the worker holds in memory; the process's baseline (the interpreter,
    torch and the engine, as measured on the worker's host). A data-parallel job is estimated
    per process (``processes`` = training.devices x training.nodes, one per device): each holds
    the baseline, the model, its slice of the global batch and the data; ``launcher_bytes`` is
    the launcher beside them (``torchrun``), once per job and not in the total."""

    model_bytes: int
    activation_bytes: int
    data_bytes: int
    baseline_bytes: int = 0
    slack_bytes: int = 0  # what a job loads beyond the baseline, the allocator's fragmentation
    processes: int = 1
    launcher_bytes: int = 0


class ValidationReport(BaseModel):
    """``POST /v1/jobs:validate``: the normalized spec and what the job would build."""

    spec: dict[str, Any]
    engine_config: dict[str, Any]
    layers: list[LayerPlan]
    params_before: int
    params_after: int
    tensorized_ratio: float | None = None
    # a pretrained hf or hf_bert job: the frozen original it distils from (4 B each in memory)
    teacher_params: int | None = None
    estimated_memory_bytes: int
    memory: MemoryPlan | None = None
    memory_capacity_bytes: int | None = None
    total_steps: int | None = None
    # what the run chooses itself (max_rank / gamma "auto"): the rule, the bounds, what the
    # plan assumed in its place and where the run reports the values it chose
    automatic: dict[str, Any] | None = None
    warnings: list[str] = []

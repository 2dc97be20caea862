"""What an ``hf`` job writes beside its compact checkpoint, and the deployment table.

:func:`hf_outputs` (called by :func:`engine.train.cli.run_job` on rank 0 after the export):
``model/hf/`` (and ``model/dense/`` with ``export_dense``) made from the saved checkpoint, so
they hold exactly what the compact file holds, then :func:`engine.measure.compare_deploy` on
``model/hf/`` as transformers loads it and on the original (the pretrained model, or for a
model trained from a config the same model multiplied out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.data import hf_tokenizer
from engine.export import load_compressed
from engine.export.hf_export import densified_net, export_dense, export_hf
from engine.measure import compare_deploy
from engine.models.hf.model import HFModel, auto_class
from engine.train.evaluation import evaluate

__all__ = ["hf_outputs"]


def _metrics(trainer: Any, net: nn.Module, original: nn.Module) -> dict[str, float]:
    """The task metric of ``net`` on the validation split (no distillation term; cosine to
    ``original`` for sentence embeddings)."""
    valid = trainer.data.valid
    if valid is None:
        return {}
    config = trainer.model_config
    model = HFModel(net, config.replace(distill_weight=1.0, task_weight=1.0))
    if config.task == "sentence_embedding":
        model.set_teacher(original)
    metrics, _ = evaluate(
        model,
        trainer.workload,
        valid.batches(0),
        device=trainer.device,
        forward_context=torch.no_grad,
        limit=trainer.job.training.eval_batches,
    )
    if config.task != "sentence_embedding":
        metrics.pop("loss", None)  # task loss only: the same as the metrics beside it
    return metrics


def hf_outputs(trainer: Any, model_dir: Path) -> dict[str, Any]:
    """Write the Hugging Face directories and measure them; the report's ``hf_export``."""
    job = trainer.job
    model, _ = load_compressed(model_dir)
    tokenizer = Path(hf_tokenizer(job.data, job.model.config, "hf"))
    # the activation-aware start's per-layer output errors (fresh runs only)
    out: dict[str, Any] = {"preparation": getattr(trainer.model, "preparation", None)}
    try:
        out["hf"] = export_hf(model, model_dir / "hf", tokenizer=tokenizer)
    except ValueError as err:
        out["hf"] = {"skipped": str(err)}
        return out
    if model.config.export_dense:
        out["dense"] = export_dense(model, model_dir / "dense", tokenizer=tokenizer)
    device = trainer.device
    config = trainer.model_config
    exported = auto_class(config.task).from_pretrained(
        str(model_dir / "hf"), trust_remote_code=True, local_files_only=True
    )
    teacher = trainer.model.teacher
    if teacher is not None:
        original, original_file = teacher, config.model_dir / "model.safetensors"
    else:
        original = densified_net(model)
        original_file = model_dir / "dense" / "model.safetensors"
    exported, original = exported.to(device).eval(), original.to(device).eval()
    out["deploy"] = compare_deploy(
        exported,
        original,
        metrics=(_metrics(trainer, exported, original), _metrics(trainer, original, original)),
        files=(model_dir / "hf" / "model.safetensors", original_file),
        seq_len=job.data.max_len,
        device=device,
    )
    out["deploy"]["original"]["kind"] = "pretrained" if teacher is not None else "densified"
    return out

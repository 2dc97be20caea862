"""Compressed checkpoints: export, load without the trainer, densify to plain torch.

A checkpoint directory is ``model.safetensors`` (the shrunk, gate-folded cores and every other
weight; tensors only, never pickle) plus ``manifest.json`` (architecture and config, modes,
ranks, per-layer and total compression, engine version, sha256 of the weights, metrics)::

    info = export_compressed(model, "ckpt", arch="transformer", model_config=cfg.to_dict(),
                             options=opts.to_dict(), tensorized=True, metrics={"acc": 0.8})
    model, manifest = load_compressed("ckpt")
    plain = densify(model)  # nn.Linear / nn.Embedding only
"""

from engine.export.densify import dense_module, densify
from engine.export.load import build_from_manifest, load_compressed, read_weights
from engine.export.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    read_manifest,
    validate_manifest,
)
from engine.export.save import ExportInfo, export_compressed

__all__ = [
    "export_compressed",
    "ExportInfo",
    "load_compressed",
    "build_from_manifest",
    "read_weights",
    "read_manifest",
    "validate_manifest",
    "densify",
    "dense_module",
    "CheckpointError",
    "FORMAT",
    "FORMAT_VERSION",
    "WEIGHTS_FILE",
    "MANIFEST_FILE",
]

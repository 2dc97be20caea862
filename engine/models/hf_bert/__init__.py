"""The ``hf_bert`` workload: a pretrained Hugging Face BERT encoder, compressed and distilled.

Leaf modules first; each imports only the ones above it (no import cycles):

* :mod:`~engine.models.hf_bert.config`: ``config.json``'s architecture and the job's
  ``model.config`` (:class:`HFBertConfig`), the model directory;
* :mod:`~engine.models.hf_bert.pooling`: the mean-pooled sentence embedding;
* :mod:`~engine.models.hf_bert.batches`: calibration sentences as batches, regrouped by length;
* :mod:`~engine.models.hf_bert.cache`: the teacher's embeddings of the training split;
* :mod:`~engine.models.hf_bert.model`: the encoder on transformers' ``BertModel``, the
  weights of ``model.safetensors``;
* :mod:`~engine.models.hf_bert.whiten`: the activation-aware TT-SVD;
* :mod:`~engine.models.hf_bert.convert`: the linears as TT layers, the student built;
* :mod:`~engine.models.hf_bert.distill`: the distillation loss;
* :mod:`~engine.models.hf_bert.calib`: the sequential fit;
* :mod:`~engine.models.hf_bert.ranks`: one budget of TT entries over the layers;
* :mod:`~engine.models.hf_bert.prepare`: ranks and refits before the first step.

This package re-exports what the rest of the engine uses.
"""

from __future__ import annotations

from engine.models.hf_bert.cache import attach_teacher_embeddings_
from engine.models.hf_bert.config import BertArchitecture, HFBertConfig
from engine.models.hf_bert.convert import (
    build_hf_bert,
    layer_row,
    legacy_name,
    tensorize_encoder_,
)
from engine.models.hf_bert.distill import distill_loss
from engine.models.hf_bert.model import (
    ENCODER_LINEARS,
    BertEncoder,
    SentenceEncoder,
    load_pretrained,
)
from engine.models.hf_bert.pooling import mean_pool
from engine.models.hf_bert.prepare import prepare_student_

__all__ = [
    "BertArchitecture",
    "HFBertConfig",
    "BertEncoder",
    "SentenceEncoder",
    "mean_pool",
    "legacy_name",
    "load_pretrained",
    "tensorize_encoder_",
    "build_hf_bert",
    "layer_row",
    "distill_loss",
    "prepare_student_",
    "attach_teacher_embeddings_",
    "ENCODER_LINEARS",
]

"""The ``hf`` workload: Hugging Face models on transformers' own modeling classes
(docs/hf-models.md#families).

Leaf modules first; each imports only the ones above it:

* :mod:`~engine.models.hf.families`: the model types accepted and their default layers;
* :mod:`~engine.models.hf.config`: the job's ``model.config`` (:class:`HFConfig`);
* :mod:`~engine.models.hf.swap`: linears / ``Conv1D`` / embeddings swapped for TT layers;
* :mod:`~engine.models.hf.model`: the student (:class:`HFModel`) and its teacher;
* :mod:`~engine.models.hf.losses`: the objective of each task.
"""

from __future__ import annotations

from engine.models.hf.config import HFConfig
from engine.models.hf.families import FAMILIES, TASKS
from engine.models.hf.losses import hf_loss
from engine.models.hf.model import HFModel, build_hf

__all__ = ["HFConfig", "HFModel", "build_hf", "hf_loss", "FAMILIES", "TASKS"]

"""The student of the ``hf`` workload: a transformers model (Auto class of the task) whose
selected linears are TT layers, with the frozen original as its teacher when pretrained.

:class:`HFModel` holds the transformers model as ``net`` (state-dict keys ``net.*``); the
teacher is kept outside the module tree, so it adds no parameters, optimizer state or
checkpoint entries, but follows the student's ``.to()``. Nothing here knows an architecture:
transformers builds it (``from_pretrained`` of the directory, safetensors only, never remote
code; or ``from_config``), :mod:`engine.models.hf.swap` swaps the layers.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.frozen_teacher import WithTeacher
from engine.models.hf.config import HFConfig
from engine.models.hf.families import TASKS, family_of
from engine.models.hf.swap import tensorize_hf_
from engine.models.hf_bert.pooling import mean_pool
from engine.models.tensorize import TensorizeOptions, TensorizeReport

__all__ = ["HFModel", "build_hf", "auto_class", "freeze_embeddings_"]


def auto_class(task: str) -> Any:
    """transformers' Auto class of ``task`` (its progress bars off: a job's log is lines)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    return getattr(transformers, TASKS[task])


class HFModel(WithTeacher):
    """``net``: the transformers model; :meth:`forward` gives the task's raw output."""

    def __init__(self, net: nn.Module, config: HFConfig) -> None:
        super().__init__()
        self.net = net
        self.config = config
        self.family = family_of(config.config_json["model_type"])
        self.swapped: dict[str, str] = {}  # module name -> its original type (swap.py)
        self.frozen: list[str] = []  # modules kept at the original (train_embeddings: false)

    def call(
        self,
        net: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        *,
        hidden: bool = False,
    ) -> Any:
        """``net`` (the student's or the teacher's) on one batch; its model output."""
        kwargs: dict[str, Any] = {"attention_mask": attention_mask.long()}  # (B, S)
        if self.family.token_types and token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids  # (B, S)
        if self.config.task == "causal_lm":
            kwargs["use_cache"] = False
        if hidden:
            kwargs["output_hidden_states"] = True
        return net(input_ids=input_ids, **kwargs)

    def cached_distillation(self) -> tuple[int, Any] | None:
        """``sentence_embedding`` distils from the teacher's mean-pooled last hidden state
        alone, so a table of the training split's may stand in for the teacher."""
        teacher = self.teacher
        if teacher is None or not self.config.pooled_distillation:
            return None

        def embed(ids: Tensor, mask: Tensor, types: Tensor | None) -> Tensor:
            hidden = self.call(teacher, ids, mask, types).last_hidden_state  # (B, S, D)
            return mean_pool(hidden, mask)  # (B, D)

        return int(teacher.config.hidden_size), embed

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Logits (B, S, V) for the LM tasks, (B, C) for classification; the last hidden
        state (B, S, D) for sentence embeddings."""
        out = self.call(self.net, input_ids, attention_mask, token_type_ids)
        if self.config.task == "sentence_embedding":
            return out.last_hidden_state  # (B, S, D)
        return out.logits


def freeze_embeddings_(net: nn.Module) -> list[str]:
    """Stop training the input embeddings of ``net`` (``train_embeddings: false``); the names
    of the frozen modules. Where the token table sits in an ``*embeddings`` module (BERT,
    RoBERTa, DistilBERT) that whole module (its token, position and token-type tables and
    LayerNorm); otherwise the token table and the other tables beside it (GPT-2's position
    table). A table tied to the output projection (GPT-2, some LLaMAs) freezes it too."""
    table = net.get_input_embeddings()
    name = next(n for n, m in net.named_modules() if m is table)
    parent_name = name.rpartition(".")[0]
    parent = net.get_submodule(parent_name) if parent_name else net
    if parent_name.rpartition(".")[2].endswith("embeddings"):
        parent.requires_grad_(False)
        return [parent_name]
    frozen = []
    for child_name, child in parent.named_children():
        if isinstance(child, nn.Embedding):
            child.requires_grad_(False)
            frozen.append(f"{parent_name}.{child_name}".lstrip("."))
    return frozen


def _load_original(config: HFConfig) -> nn.Module:
    directory = config.model_dir
    assert directory is not None
    try:
        model = auto_class(config.task).from_pretrained(
            str(directory),
            config=config.transformers_config(),
            use_safetensors=True,
            local_files_only=True,
            dtype=torch.float32,
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"path: transformers cannot load {config.path!r} ({err})") from None
    return model.eval()


def build_hf(config: HFConfig, *, tensorized: bool, options: TensorizeOptions) -> HFModel:
    """The student (dense or tensorized) with, when pretrained, the frozen original as teacher.

    Pretrained: the original's weights, then the TT-SVD of the selected layers; from a config:
    transformers' own initialization of the dense layers, fresh TT cores for the selected ones.
    """
    if config.pretrained:
        teacher = _load_original(config)
        net = copy.deepcopy(teacher)
    else:
        teacher = None
        net = auto_class(config.task).from_config(config.transformers_config(), dtype=torch.float32)
    model = HFModel(net, config)
    model.set_teacher(teacher)
    if not config.train_embeddings:
        model.frozen = freeze_embeddings_(net)
    if not tensorized:
        model.tensorize_report = TensorizeReport()
        model.conversion = []
        return model
    report, rows, kinds = tensorize_hf_(net, config, options, from_weights=config.pretrained)
    model.tensorize_report = report
    model.conversion = rows
    model.swapped = kinds
    return model

"""A pretrained Hugging Face BERT encoder in plain torch: load, pool, tensorize, distill.

The encoder is the engine's own post-LN encoder (``Embeddings`` and ``EncoderBlock`` of
:mod:`engine.models.transformer`), which is BERT's: word + position + token-type embeddings,
LayerNorm; per layer ``x = LN(x + attn(x)); x = LN(x + W2 gelu(W1 x))`` with the erf GELU.
Weights come from ``model.safetensors`` (``safetensors.torch.load_file``) under these names::

    embeddings.{word,position,token_type}_embeddings   -> embeddings.{word,position,token_type}
    embeddings.LayerNorm                                -> embeddings.norm
    encoder.layer.<i>.attention.self.{query,key,value}  -> encoder.<i>.attn.{q,k,v}
    encoder.layer.<i>.attention.output.dense            -> encoder.<i>.attn.out
    encoder.layer.<i>.attention.output.LayerNorm        -> encoder.<i>.norm1
    encoder.layer.<i>.intermediate.dense                -> encoder.<i>.ffn.fc1
    encoder.layer.<i>.output.dense / .LayerNorm         -> encoder.<i>.ffn.fc2 / encoder.<i>.norm2

(a ``bert.`` prefix is stripped; ``pooler.*``, ``cls.*`` and ``position_ids`` are not used).
The sentence embedding is the mean of the last hidden states over the attended tokens, as
sentence-transformers' mean pooling. :func:`tensorize_encoder_` swaps every selected encoder
``nn.Linear`` for ``TTLinear.from_linear`` (TT-SVD at ``max_rank``) and, optionally, the word
embedding for ``TTMEmbedding.from_embedding``. :class:`SentenceEncoder` holds the student and,
outside its module tree (no parameters, no state-dict entries), the frozen dense teacher that
:func:`distill_loss` compares it with.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.hf_bert_cache import TeacherEmbeddings
from engine.models.hf_bert_config import BertArchitecture, HFBertConfig
from engine.models.hf_bert_init import balance_cores_
from engine.models.tensorize import TensorizeOptions, TensorizeReport
from engine.models.transformer import Embeddings, EncoderBlock
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import SkippedLayer

__all__ = ["BertEncoder", "SentenceEncoder", "mean_pool", "hf_to_engine_name",
           "load_pretrained", "tensorize_encoder_", "build_hf_bert", "layer_row", "distill_loss",
           "ENCODER_LINEARS"]  # fmt: skip

ENCODER_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")
_LAYER_NAMES = {
    "attention.self.query": "attn.q", "attention.self.key": "attn.k",
    "attention.self.value": "attn.v", "attention.output.dense": "attn.out",
    "attention.output.LayerNorm": "norm1", "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2", "output.LayerNorm": "norm2",
}  # fmt: skip
_EMBEDDING_NAMES = {"word_embeddings": "word", "position_embeddings": "position",
                    "token_type_embeddings": "token_type", "LayerNorm": "norm"}  # fmt: skip
_UNUSED = re.compile(r"^(pooler\.|cls\.)|(^|\.)position_ids$")
_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
_EMBED = re.compile(r"^embeddings\.(\w+)\.(weight|bias|gamma|beta)$")
_LEAF = {"gamma": "weight", "beta": "bias"}  # names of old TF-converted LayerNorms


class BertEncoder(nn.Module):
    """``(input_ids (B,S), attention_mask, token_type_ids) -> last hidden state (B, S, D)``."""

    def __init__(self, arch: BertArchitecture, dropout: float = 0.0) -> None:
        super().__init__()
        self.arch = arch
        enc = arch.encoder_config(dropout)

        def word(num: int, dim: int) -> nn.Embedding:
            return nn.Embedding(num, dim, padding_idx=arch.pad_token_id)

        self.embeddings = Embeddings(enc, word)
        self.encoder = nn.ModuleList([EncoderBlock(enc, lambda role, i, o: nn.Linear(i, o))
                                      for _ in range(enc.n_layers)])  # fmt: skip

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, S), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.arch.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} > max_position_embeddings "
                f"{self.arch.max_position_embeddings}"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # (B, S)
        keep = None
        if attention_mask is not None:
            keep = attention_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S) True = attend
        x = self.embeddings(input_ids, token_type_ids)  # (B, S, D)
        for block in self.encoder:
            x = block(x, keep)  # (B, S, D)
        return x


def mean_pool(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Mean of ``hidden (B, S, D)`` over the attended positions: ``(B, D)``."""
    if attention_mask is None:
        return hidden.mean(1)  # (B, D)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
    total = (hidden * w).sum(1)  # (B, D)
    return total / w.sum(1).clamp_min(1e-9)  # (B, D)


class SentenceEncoder(BertEncoder):
    """The student encoder; ``teacher`` is the frozen original (``None`` when built bare).

    The teacher is kept outside the module tree, so it adds no parameters, optimizer state
    or checkpoint entries; ``.to()`` / ``.double()`` move it along with the student.
    """

    def __init__(self, arch: BertArchitecture, config: HFBertConfig) -> None:
        super().__init__(arch, config.dropout)
        self.config = config
        self.__dict__["teacher"] = None
        self.__dict__["teacher_embeddings"] = None

    @property
    def teacher_embeddings(self) -> TeacherEmbeddings | None:
        """The training split's teacher embeddings (:mod:`engine.models.hf_bert_cache`)."""
        return self.__dict__["teacher_embeddings"]

    def set_teacher_embeddings(self, table: TeacherEmbeddings | None) -> None:
        self.__dict__["teacher_embeddings"] = table

    @property
    def teacher(self) -> BertEncoder | None:
        return self.__dict__["teacher"]

    def set_teacher(self, teacher: BertEncoder | None) -> None:
        if teacher is not None:
            teacher.eval().requires_grad_(False)
        self.__dict__["teacher"] = teacher

    def _apply(self, fn: Any, recurse: bool = True) -> SentenceEncoder:
        super()._apply(fn, recurse)
        if self.teacher is not None:
            self.teacher._apply(fn, recurse)
        return self

    def embed(self, input_ids: Tensor, attention_mask: Tensor | None = None,
              token_type_ids: Tensor | None = None) -> Tensor:  # fmt: skip
        """Sentence embeddings ``(B, D)`` (mean pooling)."""
        return mean_pool(self(input_ids, attention_mask, token_type_ids), attention_mask)


# -- weights --------------------------------------------------------------------------------
def hf_to_engine_name(key: str) -> str | None:
    """Our state-dict name of a Hugging Face BERT weight; ``None`` for the unused ones."""
    key = key.removeprefix("bert.")
    if _UNUSED.search(key):
        return None
    if m := _LAYER.match(key):
        i, sub, leaf = m.groups()
        if sub in _LAYER_NAMES:
            return f"encoder.{i}.{_LAYER_NAMES[sub]}.{_LEAF.get(leaf, leaf)}"
    if (m := _EMBED.match(key)) and m.group(1) in _EMBEDDING_NAMES:
        return f"embeddings.{_EMBEDDING_NAMES[m.group(1)]}.{_LEAF.get(m.group(2), m.group(2))}"
    raise ValueError(
        f"path: model.safetensors holds {key!r}, which is not a BERT encoder "
        f"weight (unsupported architecture)"
    )


def _mapped_state(weights: Mapping[str, Tensor], model: nn.Module, origin: Path) -> dict:
    state: dict[str, Tensor] = {}
    for key, value in weights.items():
        name = hf_to_engine_name(key)
        if name is not None:
            state[name] = value
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(
            f"path: {origin} lacks weights for {missing[:6]} "
            f"({len(missing)} missing; does config.json match the weights?)"
        )
    wrong = [f"{k}: file {tuple(state[k].shape)}, config.json {tuple(own[k].shape)}"
             for k in own if state[k].shape != own[k].shape]  # fmt: skip
    if wrong:
        raise ValueError(f"path: {origin} has weights of the wrong shape: {wrong[:4]}")
    return {k: state[k].to(torch.float32) for k in own}


def load_pretrained(directory: Path, arch: BertArchitecture) -> BertEncoder:
    """The dense encoder of ``directory`` (``model.safetensors``), in eval mode, float32."""
    origin = directory / "model.safetensors"
    try:
        weights = safetensors.torch.load_file(str(origin))
    except Exception as err:  # safetensors raises its own error types
        raise ValueError(f"path: {origin} is not a readable safetensors file ({err})") from None
    model = BertEncoder(arch)
    model.load_state_dict(_mapped_state(weights, model, origin), strict=True)
    return model.eval()


# -- tensorization --------------------------------------------------------------------------
def _candidates(model: BertEncoder, embeddings: bool) -> list[tuple[str, nn.Module]]:
    names = [f"encoder.{i}.{s}" for i in range(len(model.encoder)) for s in ENCODER_LINEARS]
    if embeddings:
        names.insert(0, "embeddings.word")
    return [(n, model.get_submodule(n)) for n in names]


def layer_row(name: str, layer: TTLinear | TTMEmbedding, dense_weight: Tensor) -> dict:
    """The conversion report of one layer: modes, ranks, sizes, relative weight error."""
    with torch.no_grad():
        approx = layer.to_dense()  # (out, in) or (V, D)
        ref = dense_weight.to(approx.dtype)  # (out, in) or (V, D)
        err = float(torch.linalg.vector_norm(approx - ref) / torch.linalg.vector_norm(ref))
    if isinstance(layer, TTLinear):
        kind, modes = "tt_linear", [list(layer.in_modes), list(layer.out_modes)]
    else:
        kind, modes = "ttm_embedding", [list(layer.row_modes), list(layer.col_modes)]
    return {"name": name, "kind": kind, "modes": modes, "ranks": list(layer.ranks),
            "params": layer.tt_parameters(), "dense": layer.dense_parameters(),
            "ratio": layer.compression_ratio(), "relative_error": err}  # fmt: skip


def tensorize_encoder_(
    model: BertEncoder,
    options: TensorizeOptions,
    *,
    embeddings: bool,
    from_weights: bool = True,
) -> TensorizeReport:
    """Replace the selected layers by TT / TTM ones in place; attach and return the report.

    A layer is converted when it matches one of ``options.layers`` and its dense weight has at
    least ``options.min_size`` entries. ``from_weights``: TT-SVD of the current weights (the
    per-layer modes, ranks, sizes and relative weight error go to ``model.conversion``);
    otherwise fresh layers of the same shapes (a checkpoint's weights are loaded next).
    """
    candidates = _candidates(model, embeddings)
    for pattern in options.layers:
        if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in candidates):
            raise ValueError(
                f"layers: pattern {pattern!r} matches no tensorizable layer of "
                f"the BERT encoder; candidates are {[n for n, _ in candidates]}"
            )
    done, skipped, rows = [], [], []
    common = {"gate_threshold": options.gate_threshold, "d": options.d}
    for name, dense in candidates:
        kind = "embedding" if isinstance(dense, nn.Embedding) else "linear"
        size = dense.weight.numel()
        if not options.selects(name):
            skipped.append(
                SkippedLayer(name, kind, f"not selected by layers={list(options.layers)}")
            )
            continue
        if size < options.min_size:
            skipped.append(
                SkippedLayer(
                    name, kind, f"dense weight has {size} < min_size={options.min_size} entries"
                )
            )
            continue
        try:
            layer = _convert(dense, options, common, from_weights)
        except ValueError as err:
            raise ValueError(f"cannot tensorize {name!r}: {err}") from err
        if from_weights:
            if isinstance(layer, TTLinear):
                balance_cores_(layer)  # same product; even core norms for one Adam lr
            rows.append(layer_row(name, layer, dense.weight.detach()))
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer)
        done.append(name)
    report = TensorizeReport(tuple(done), tuple(skipped))
    model.tensorize_report = report
    model.conversion = rows
    return report


def _convert(dense: nn.Module, options: TensorizeOptions, common: dict[str, Any],
             from_weights: bool) -> nn.Module:  # fmt: skip
    if isinstance(dense, nn.Embedding):
        rank = options.embedding_rank
        if from_weights:
            return TTMEmbedding.from_embedding(dense, max_rank=rank, **common)
        return TTMEmbedding(dense.num_embeddings, dense.embedding_dim, max_rank=rank,
                            padding_idx=dense.padding_idx, **common)  # fmt: skip
    assert isinstance(dense, nn.Linear)
    if from_weights:
        return TTLinear.from_linear(dense, max_rank=options.max_rank, **common)
    return TTLinear(dense.in_features, dense.out_features, dense.bias is not None,
                    max_rank=options.max_rank, **common)  # fmt: skip


def build_hf_bert(
    config: HFBertConfig, *, tensorized: bool, options: TensorizeOptions
) -> SentenceEncoder:
    """The student (dense or TT-SVD-converted) with the frozen original as its teacher.

    With ``config.path``: the weights of the directory; without: the bare architecture of
    ``config.architecture`` (random weights, fresh TT layers), to load a checkpoint into.
    """
    model = SentenceEncoder(config.arch, config)
    directory = config.model_dir
    if directory is not None:
        teacher = load_pretrained(directory, config.arch)
        model.load_state_dict(teacher.state_dict(), strict=True)  # copies: nothing shared
        model.set_teacher(teacher)
    if not config.train_embeddings:
        model.embeddings.requires_grad_(False)
    if not tensorized:
        model.tensorize_report = TensorizeReport()
        model.conversion = []
        return model
    tensorize_encoder_(model, options, embeddings=config.tensorize_embeddings,
                       from_weights=directory is not None)  # fmt: skip
    return model


# -- the distillation loss ------------------------------------------------------------------
def distill_loss(model: SentenceEncoder, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    """``(distill_weight * loss, sums)``; sums: ``count``, ``loss_sum``, ``cosine_sum``.

    ``mse_hidden``: mean squared difference of the last hidden states over attended tokens;
    ``cosine_embedding``: mean ``1 - cos`` of the pooled sentence embeddings; ``none``: zero.
    ``cosine_sum`` is always the summed student/teacher cosine of the sentence embeddings.
    With ``cosine_embedding`` the teacher's embeddings come from ``model.teacher_embeddings``
    when it holds every sentence of the batch (the teacher runs otherwise).
    """
    teacher = model.teacher
    if teacher is None:
        raise ValueError(
            "model.config.path: distillation needs the original model (this "
            "encoder was built without a path, e.g. loaded from a checkpoint)"
        )
    ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
    types = batch.get("token_type_ids")
    hidden = model(ids, mask, types)  # (B, S, D)
    emb = mean_pool(hidden, mask)  # (B, D)
    kind = model.config.distill
    table = model.teacher_embeddings if kind == "cosine_embedding" else None
    t_emb = None if table is None else table.lookup(ids, mask, types)  # (B, D) or None
    if t_emb is None:
        with torch.no_grad():
            t_hidden = teacher(ids, mask, types)  # (B, S, D)
            t_emb = mean_pool(t_hidden, mask)  # (B, D)
    cos = F.cosine_similarity(emb, t_emb.to(emb.dtype), dim=-1)  # (B,)
    if kind == "cosine_embedding":
        loss = (1.0 - cos).mean()  # ()
    elif kind == "mse_hidden":
        w = mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
        sq = ((hidden - t_hidden) ** 2 * w).sum()  # ()
        loss = sq / (w.sum() * hidden.shape[-1]).clamp_min(1.0)  # ()
    else:
        loss = hidden.sum() * 0.0  # () attached to the graph, zero gradient
    loss = loss * model.config.distill_weight  # ()
    with torch.no_grad():
        n = torch.tensor(float(ids.shape[0]), device=hidden.device)
        sums = {"count": n, "loss_sum": loss.detach() * n, "cosine_sum": cos.sum()}
    return loss, sums

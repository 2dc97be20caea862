"""The configurations :mod:`bench.train_step` times: models, optimizers, losses, one step.

* ``comera``: ``build_transformer(mnli, tensorized=True, max_rank=30, shapes="mnli")``, AdamW
  in three groups (TT/TTM cores lr 1e-4, gates 1e-3, others 5e-5, weight decay 0), loss
  ``CE + 0.01 R`` with ``R = GateIndex(model, "cost_weighted").penalty()``, the forward inside
  the engine's CPU fast path (:class:`engine.train.fast_path.FastPath`, the trainer's default).
* ``comera_eager``: the same without the fast path (each TT-linear merges its own cores).
* ``dense``: the dense model, ``torch.optim.AdamW(lr=1e-4)`` with torch's default settings
  (the baseline of the targets).
* ``dense_fused``: the same with ``fused=True`` (torch's fused AdamW kernel; CoMERA's AdamW is
  fused too), reported beside it: the default for-loop AdamW over 67 M parameters is about half
  of a dense step at batch 1 on this machine, so the batch-1 ratio depends on this choice.
* ``galore``: the dense model, galore-torch's ``GaLoreAdamW`` (lr 1e-4) with the GaLore
  README's groups: the 2-D weights of the encoder linears projected (rank 128, update gap
  200, scale 0.25, ``std``), every other parameter plain.
* ``tltorch``: the same transformer with TensorLy-Torch layers where CoMERA has TT ones:
  ``tltorch.FactorizedLinear(in_modes, out_modes, factorization="blocktt", rank=30)`` with the
  MNLI modes of every encoder linear and the classifier's first layer, and the word embedding
  as ``tltorch.FactorizedEmbedding`` (BlockTT, the MNLI row / column modes, rank 32: the table
  padded to 32000 rows as CoMERA's). No gates, so the loss is CE; AdamW over two flat groups
  (factors lr 1e-4, others 5e-5), as CoMERA's optimizer runs. Its BlockTT einsum keeps about
  0.9 GB of activations per sequence (7.4 GB at batch 8, ~29 GB at 32: more than this machine
  has), so above :data:`MICRO_BATCH` a step runs as micro-batches of that many sequences, each
  loss weighted by its share of the batch and the gradients summed before the one optimizer
  step: the gradient of the whole batch's mean loss, in the time of all micro-batches.

CoMERA's and TensorLy-Torch's AdamW run fused over flat buffers (:mod:`engine.nn.flat`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.transformer import (
    MNLI_SHAPES,
    TransformerClassifier,
    TransformerConfig,
    build_transformer,
)
from engine.nn.flat import FlatBuffer, flatten_
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank.penalty import GateIndex
from engine.train.fast_path import FastPath

__all__ = [
    "CONFIGS",
    "COMERA_ADAMW",
    "COMERA_LR",
    "DENSE_LR",
    "GALORE",
    "MICRO_BATCH",
    "STEP_SETTINGS",
    "TLTORCH_RANK",
    "Runner",
    "build",
    "comera_config",
    "make_inputs",
    "warm_up",
]

CONFIGS = ("comera", "comera_eager", "dense", "dense_fused", "galore", "tltorch")
SEQ, SEED, PENALTY_WEIGHT = 128, 0, 0.01
COMERA_LR = {"cores": 1e-4, "gates": 1e-3, "others": 5e-5}
COMERA_ADAMW: dict = {"fused": True}  # over three flat buffers (engine.nn.flat)
DENSE_LR = 1e-4
GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}
TLTORCH_RANK = {"linear": 30, "embedding": 32}  # CoMERA's max_rank and embedding ranks
# what every configuration's step shares (the "settings" of the CPU and CUDA JSON)
STEP_SETTINGS = {
    "model": "TransformerConfig.mnli() (six encoders, d 768, ff 3072, 12 heads)",
    "seq_len": SEQ,
    "seed": SEED,
    "dtype": "float32",
    "dropout": "on (train mode)",
}
LOWRANK_FROM_BATCH = 16  # from here on activations dominate memory (train_step doc)
MICRO_BATCH = {"tltorch": 8}  # above this batch a step runs in micro-batches of this size


def comera_config(batch: int) -> TransformerConfig:
    """The CoMERA model's config at ``batch``: TT-linear outputs kept as rank-r factors
    (:mod:`engine.contract.lowrank_saved`) where activations dominate memory; the attention
    probabilities kept (``recompute_attention=False``: 150 MB more at batch 32, one ``q k^T``
    and softmax less per layer in backward, 6% of the step on this machine)."""
    lowrank = batch >= LOWRANK_FROM_BATCH
    return TransformerConfig.mnli(recompute_tt_outputs=lowrank, recompute_attention=False)


def make_inputs(batch: int, cfg: TransformerConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Token ids (B, S), token types (B, S), attention mask (B, S), labels (B,)."""
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, cfg.vocab_size, (batch, SEQ), generator=g)  # (B, S)
    types = (torch.arange(SEQ) >= SEQ // 2).long().expand(batch, SEQ).contiguous()  # (B, S)
    mask = torch.ones(batch, SEQ, dtype=torch.bool)  # (B, S)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=g)  # (B,)
    return ids, types, mask, labels


# -- optimizers -----------------------------------------------------------------------------
def comera_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The three CoMERA groups: TT / TTM cores, rank gates, everything else."""
    cores, gates = [], []
    for mod in model.modules():
        if isinstance(mod, TTLinear | TTMEmbedding):
            cores += list(mod.cores)
            gates += list(mod.gates)
    seen = {id(p) for p in cores + gates}
    others = [p for p in model.parameters() if id(p) not in seen]
    return {"cores": cores, "gates": gates, "others": others}


def tltorch_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """TensorLy-Torch factors (``cores``) and everything else."""
    from tltorch import FactorizedEmbedding, FactorizedLinear

    cores = [
        p
        for m in model.modules()
        if isinstance(m, FactorizedLinear | FactorizedEmbedding)
        for p in m.weight.parameters()
    ]
    seen = {id(p) for p in cores}
    return {"cores": cores, "others": [p for p in model.parameters() if id(p) not in seen]}


def flat_adamw(
    groups: dict[str, list[nn.Parameter]],
) -> tuple[torch.optim.Optimizer, list[FlatBuffer]]:
    """Fused AdamW over one flat buffer per group (:mod:`engine.nn.flat`)."""
    flats = {k: flatten_(ps) for k, ps in groups.items() if ps}
    params = [{"params": [f.param], "lr": COMERA_LR[k]} for k, f in flats.items()]
    return torch.optim.AdamW(params, weight_decay=0.0, **COMERA_ADAMW), list(flats.values())


def galore_groups(model: TransformerClassifier) -> list[dict]:
    """GaLore README groups: encoder ``nn.Linear`` weights projected, the rest plain."""
    projected = [m.weight for m in model.encoder.modules() if isinstance(m, nn.Linear)]
    ids = {id(p) for p in projected}
    regular = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": regular}, {"params": projected, **GALORE}]


# -- models ---------------------------------------------------------------------------------
def tltorch_transformer(cfg: TransformerConfig, mnli: bool = True) -> TransformerClassifier:
    """The transformer with TensorLy-Torch BlockTT layers where CoMERA has TT / TTM ones.

    ``mnli``: the MNLI modes and ranks; otherwise automatic two-mode shapes, rank 4 (warm-up).
    """
    from tltorch import FactorizedEmbedding, FactorizedLinear
    from tltorch.utils import get_tensorized_shape

    def make_linear(role: str, n_in: int, n_out: int) -> nn.Module:
        if mnli:
            in_modes, out_modes = MNLI_SHAPES[role]
            rank = TLTORCH_RANK["linear"]
        else:
            in_modes, out_modes = get_tensorized_shape(n_in, n_out, order=2, verbose=False)
            rank = 4
        return FactorizedLinear(
            tuple(in_modes), tuple(out_modes), bias=True, factorization="blocktt", rank=rank
        )

    def make_embedding(num: int, dim: int) -> nn.Module:
        if not mnli:
            return FactorizedEmbedding(num, dim, n_tensorized_modes=2, rank=4)
        rows, cols, _ = MNLI_SHAPES["embedding"]
        return FactorizedEmbedding(
            math.prod(rows),
            dim,
            auto_tensorize=False,
            tensorized_num_embeddings=rows,
            tensorized_embedding_dim=cols,
            factorization="blocktt",
            rank=TLTORCH_RANK["embedding"],
        )

    return TransformerClassifier(cfg, make_linear, make_embedding)


@dataclass
class Runner:
    """One configuration: ``step()`` returns (seconds in total, seconds in the optimizer)."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[], Tensor]
    flats: tuple[FlatBuffer, ...] = ()  # flattened parameter groups (CoMERA, TensorLy-Torch)
    info: dict = field(default_factory=dict)
    micro_losses: tuple[Callable[[], Tensor], ...] = ()  # the step in micro-batches, if set

    def step(self) -> tuple[float, float]:
        start = time.perf_counter()
        if self.flats:  # every parameter is a member of one (_runner); the flat grads too
            for flat in self.flats:
                flat.zero_grad_()
        else:
            self.model.zero_grad(set_to_none=True)
        for loss in self.micro_losses or (self.loss,):
            loss().backward()  # gradients of the micro-batches add up
        mid = time.perf_counter()
        for flat in self.flats:
            flat.gather_grad_()
        self.optimizer.step()
        end = time.perf_counter()
        return end - start, end - mid

    def refresh_step(self) -> tuple[float, float]:
        """A GaLore step that recomputes every projection (an SVD per projected weight)."""
        gap = GALORE["update_proj_gap"]
        for group in self.optimizer.param_groups:
            if "rank" in group:
                for p in group["params"]:
                    state = self.optimizer.state[p]
                    state["step"] = -(-state.get("step", 0) // gap) * gap
        return self.step()


def _model(name: str, cfg: TransformerConfig, mnli: bool) -> nn.Module:
    if name.startswith("comera"):
        rank, shapes = (30, "mnli") if mnli else (4, "auto")
        return build_transformer(cfg, tensorized=True, max_rank=rank, shapes=shapes)
    if name == "tltorch":
        return tltorch_transformer(cfg, mnli)
    return build_transformer(cfg, tensorized=False)


def _micro_losses(
    model: nn.Module, inputs: tuple[Tensor, ...], size: int
) -> tuple[Callable[[], Tensor], ...]:
    """CE of the batch as losses of micro-batches of ``size`` sequences, each weighted by its
    share of the batch (their gradients sum to the whole batch's)."""
    ids, types, mask, labels = inputs
    batch = ids.shape[0]

    def part(lo: int) -> Callable[[], Tensor]:
        sl = slice(lo, min(batch, lo + size))
        share = (sl.stop - lo) / batch
        return lambda: F.cross_entropy(model(ids[sl], types[sl], mask[sl]), labels[sl]) * share

    return tuple(part(lo) for lo in range(0, batch, size))


def _runner(name: str, model: nn.Module, inputs: tuple[Tensor, ...], galore_rank: int) -> Runner:
    ids, types, mask, labels = inputs
    flats: list[FlatBuffer] = []
    info: dict = {"parameters": sum(p.numel() for p in model.parameters())}
    if name.startswith("comera"):
        optimizer, flats = flat_adamw(comera_groups(model))
        index = GateIndex(model, "cost_weighted")
        fast = FastPath(model) if name == "comera" else None
        info["fast_path"] = fast is not None

        def loss() -> Tensor:
            if fast is None:
                logits = model(ids, types, mask)
            else:
                with fast.session():
                    logits = model(ids, types, mask)
            return F.cross_entropy(logits, labels) + PENALTY_WEIGHT * index.penalty()
    else:
        if name == "tltorch":
            optimizer, flats = flat_adamw(tltorch_groups(model))
        elif name in ("dense", "dense_fused"):
            fused = {"fused": True} if name == "dense_fused" else {}
            optimizer = torch.optim.AdamW(model.parameters(), lr=DENSE_LR, **fused)
        else:
            from bench.common import galore_adamw  # a stub for bitsandbytes where it is missing

            GaLoreAdamW = galore_adamw()
            groups = galore_groups(model)
            groups[1].update(rank=galore_rank)
            optimizer = GaLoreAdamW(groups, lr=DENSE_LR, no_deprecation_warning=True)

        def loss() -> Tensor:
            return F.cross_entropy(model(ids, types, mask), labels)

    if flats and sum(len(f.members) for f in flats) != len(list(model.parameters())):
        raise RuntimeError(f"{name}: the flat buffers must hold every parameter")
    micro = MICRO_BATCH.get(name)
    micro_losses = (
        () if micro is None or ids.shape[0] <= micro else _micro_losses(model, inputs, micro)
    )
    info["micro_batches"] = max(1, len(micro_losses))
    return Runner(name, model, optimizer, loss, tuple(flats), info, micro_losses)


def build(name: str, batch: int, cfg: TransformerConfig | None = None) -> Runner:
    """The model, optimizer and loss of configuration ``name`` on the bench inputs."""
    torch.manual_seed(SEED)
    cfg = cfg or (comera_config(batch) if name.startswith("comera") else TransformerConfig.mnli())
    model = _model(name, cfg, mnli=True)
    model.train()
    return _runner(name, model, make_inputs(batch, cfg), GALORE["rank"])


def warm_up() -> None:
    """A tiny step of every configuration: thread pools, lazy imports, kernels, arenas."""
    for name in CONFIGS:
        cfg = TransformerConfig.tiny(max_len=SEQ)
        torch.manual_seed(SEED)
        model = _model(name, cfg, mnli=False)
        runner = _runner(name, model, make_inputs(2, cfg), galore_rank=4)
        for _ in range(2):  # the fast path learns its sibling runs on the first forward
            runner.step()

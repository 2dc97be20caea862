"""The workload registry: every architecture dense and tensorized; batches, losses, configs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from engine.models.dlrm import DLRMConfig
from engine.models.mlm import MLMConfig
from engine.models.mlp import MLPConfig
from engine.models.registry import (
    WORKLOADS,
    StepOutput,
    TensorizeOptions,
    Workload,
    build_model,
    get_workload,
    register_workload,
)
from engine.models.transformer import TransformerConfig
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.engine.models.densify import densify_, perturb_gates_
from tests.helpers.assertions import assert_close_rel

TINY = {
    "transformer": TransformerConfig.tiny(),
    "dlrm": DLRMConfig.tiny(),
    "mlm": MLMConfig.tiny(),
    "mlp": MLPConfig.tiny(),
}
ARCHS = sorted(TINY)
SMALL = TensorizeOptions(max_rank=4)


def batch_for(arch: str, b: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    return get_workload(arch).example_batch(TINY[arch], b, torch.Generator().manual_seed(seed))


def raw_forward(arch: str, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if arch == "transformer":
        return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    if arch == "dlrm":
        return model(batch["dense"], batch["sparse"])
    if arch == "mlm":
        return model(batch["input_ids"], batch["attention_mask"])
    return model(batch["x"])


def to_double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def test_registry_lists_the_architectures():
    assert set(WORKLOADS) == {"transformer", "dlrm", "mlm", "mlp", "hf_bert", "hf"}
    assert get_workload("dlrm").batch_keys == ("dense", "sparse", "labels")
    assert get_workload("mlm").batch_keys == ("input_ids", "attention_mask", "labels")
    assert get_workload("mlp").batch_keys == ("x", "labels")
    with pytest.raises(ValueError, match="model.arch"):
        get_workload("resnet")


def test_a_workload_registers_once_by_its_name():
    before = dict(WORKLOADS)
    assert all(type(w).name == name for name, w in WORKLOADS.items())
    with pytest.raises(ValueError, match="'mlp' is already registered"):
        register_workload(type(WORKLOADS["mlp"]))
    with pytest.raises(TypeError, match="with a name"):
        register_workload(type("Nameless", (Workload,), {}))
    assert WORKLOADS == before


@pytest.mark.parametrize("arch", ARCHS)
def test_example_batch_is_valid(arch):
    w = get_workload(arch)
    cfg = TINY[arch]
    batch = batch_for(arch, b=6)
    assert set(w.batch_keys) <= set(batch)
    again = batch_for(arch, b=6)
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # the generator decides
    other = batch_for(arch, b=6, seed=1)
    assert any(not torch.equal(batch[k], other[k]) for k in batch)
    if arch == "dlrm":
        assert batch["dense"].shape == (6, 13) and batch["dense"].dtype == torch.float32
        assert batch["sparse"].shape == (6, 4) and batch["sparse"].dtype == torch.long
        assert (batch["sparse"] >= 0).all()
        assert (batch["sparse"] < torch.tensor(cfg.table_sizes)).all()
        assert batch["labels"].dtype == torch.float32 and set(batch["labels"].tolist()) <= {0, 1}
    elif arch == "mlp":
        assert batch["x"].shape == (6, 48) and batch["x"].dtype == torch.float32
        assert batch["labels"].dtype == torch.long and batch["labels"].max() < cfg.num_classes
    else:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert ids.shape == mask.shape == (6, 16) and ids.dtype == torch.long
        assert mask.dtype == torch.bool and mask[:, 0].all() and mask.all(1).any()
        assert 0 <= int(ids.min()) and int(ids.max()) < cfg.vocab_size
        if arch == "mlm":
            chosen = labels != -100
            assert chosen.any(1).all() and not (chosen & ~mask).any()
            assert (ids[chosen] == cfg.vocab_size - 1).all()
            assert (labels[chosen] >= 0).all() and (labels[chosen] < cfg.vocab_size).all()
        else:
            assert labels.shape == (6,) and labels.max() < cfg.num_classes
    batch = w.example_batch(cfg, 2, seq_len=8) if arch in ("mlm", "transformer") else None
    if batch is not None:
        assert batch["input_ids"].shape == (2, 8)
        with pytest.raises(ValueError, match="seq_len"):
            w.example_batch(cfg, 2, seq_len=cfg.max_len + 1)
    with pytest.raises(ValueError, match="batch_size"):
        w.example_batch(cfg, 0)


OUT_SHAPES = {"transformer": (4, 3), "dlrm": (4,), "mlm": (4, 16, 120), "mlp": (4, 5)}


@pytest.mark.parametrize("tensorized", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_shapes_dtypes_and_gradients(arch, tensorized):
    model = build_model(arch, TINY[arch].to_dict(), tensorized=tensorized, options=SMALL)
    kinds = {type(m) for m in model.modules()}
    assert (TTLinear in kinds) == tensorized
    if arch != "mlp":
        assert (TTMEmbedding in kinds) == tensorized
    batch = batch_for(arch)
    out = raw_forward(arch, model, batch)
    assert out.shape == OUT_SHAPES[arch] and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    step = get_workload(arch).forward_loss(model, batch)
    assert isinstance(step, StepOutput) and step.loss.shape == () and step.loss.requires_grad
    assert set(step.sums) == {"count", "loss_sum", "correct"}
    assert all(not v.requires_grad and v.shape == () for v in step.sums.values())
    step.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    # every parameter the batch reaches gets a finite gradient
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    missing = [n for n, g in grads.items() if g is None]
    assert missing == []


@pytest.mark.parametrize("arch", ARCHS)
def test_tensorized_model_equals_its_dense_reconstruction(arch):
    """Float64: the TT / TTM forward against nn.Linear / nn.Embedding holding ``to_dense()``."""
    opts = TensorizeOptions(max_rank=5, min_size=1)
    model = build_model(arch, TINY[arch], tensorized=True, options=opts).double().eval()
    perturb_gates_(model, torch.Generator().manual_seed(3))
    batch = to_double(batch_for(arch))
    out = raw_forward(arch, model, batch)
    step = get_workload(arch).forward_loss(model, batch)
    replaced = densify_(model)
    assert len(replaced) == len(model.tensorize_report.tensorized) > 0
    assert not any(isinstance(m, TTLinear | TTMEmbedding) for m in model.modules())
    assert_close_rel(raw_forward(arch, model, batch), out, 1e-10, f"{arch} dense reconstruction")
    ref = get_workload(arch).forward_loss(model, batch)
    assert abs(float(ref.loss.detach()) - float(step.loss.detach())) < 1e-10


@pytest.mark.parametrize("tensorized", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_few_adamw_steps_lower_the_loss(arch, tensorized):
    cfg = TINY[arch]
    if hasattr(cfg, "dropout"):
        cfg = cfg.replace(dropout=0.0, **({"attn_dropout": 0.0} if arch != "mlp" else {}))
    model = build_model(arch, cfg, tensorized=tensorized, options=SMALL)
    w = get_workload(arch)
    batch = w.example_batch(cfg, 4, torch.Generator().manual_seed(5))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    losses = []
    for _ in range(8):
        step = w.forward_loss(model, batch)
        losses.append(float(step.loss.detach()))
        opt.zero_grad()
        step.loss.backward()
        opt.step()
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.75 * losses[0], losses


@pytest.mark.parametrize("arch", ARCHS)
def test_options_reach_every_tensorized_layer(arch):
    opts = TensorizeOptions(max_rank=3, embedding_max_rank=5, gate_threshold=0.2, d=2, min_size=1)
    model = build_model(arch, TINY[arch], tensorized=True, options=opts)
    tt = [m for m in model.modules() if isinstance(m, TTLinear)]
    ttm = [m for m in model.modules() if isinstance(m, TTMEmbedding)]
    assert tt and (ttm or arch == "mlp")
    for m in tt:
        assert m.gate_threshold == 0.2 and len(m.in_modes) == len(m.out_modes) == 2
        assert max(m.ranks) <= 3
    assert max(max(m.ranks) for m in tt) == 3
    for m in ttm:
        assert m.gate_threshold == 0.2 and len(m.row_modes) == 2
        assert max(m.ranks) <= 5
    if ttm:
        assert max(max(m.ranks) for m in ttm) == 5
    names = {n for n, m in model.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}
    assert names == set(model.tensorize_report.tensorized)
    assert model.tensorize_report.skipped == ()


@pytest.mark.parametrize("arch", ["dlrm", "mlm", "mlp"])
def test_paper_shapes_are_transformer_only(arch):
    with pytest.raises(ValueError, match=r"compression\.shapes"):
        build_model(arch, TINY[arch], tensorized=True, options=TensorizeOptions(shapes="paper"))
    build_model(arch, TINY[arch], tensorized=False, options=TensorizeOptions(shapes="paper"))


def test_transformer_paper_shapes_errors_name_the_compression_fields():
    with pytest.raises(ValueError, match=r"compression\.shapes: 'paper'.*d_model=768"):
        build_model(
            "transformer",
            TINY["transformer"],
            tensorized=True,
            options=TensorizeOptions(shapes="paper"),
        )
    with pytest.raises(ValueError, match=r"compression\.d"):
        build_model(
            "transformer",
            TransformerConfig.mnli(n_layers=1),
            tensorized=True,
            options=TensorizeOptions(shapes="paper", d=3),
        )


@pytest.mark.parametrize(
    ("arch", "data", "field"),
    [
        ("transformer", {"d_model": 30}, "d_model"),
        ("transformer", {"dropout": 1.5}, "dropout"),
        ("dlrm", {"table_sizes": []}, "table_sizes"),
        ("dlrm", {"table_sizes": [10, 0]}, "table_sizes"),
        ("dlrm", {"embedding_dim": "16"}, "embedding_dim"),
        ("dlrm", {"bottom_widths": 64}, "bottom_widths"),
        ("mlm", {"n_heads": 5}, "d_model"),
        ("mlm", {"ln_eps": 0}, "ln_eps"),
        ("mlp", {"hidden": []}, "hidden"),
        ("mlp", {"activation": "tanh"}, "activation"),
        ("mlp", {"num_classes": 0}, "num_classes"),
        ("mlp", {"version": 2}, "version"),
        ("mlp", {"widths": [3]}, "widths"),
        ("dlrm", {"tables": 3, "dense": 2}, "dense"),
    ],
)
def test_bad_config_fields_are_named(arch, data, field):
    with pytest.raises(ValueError, match=rf"model\.config\.{field}\b"):
        get_workload(arch).config_from_dict(data)


def test_config_from_dict_round_trips_and_rejects_non_mappings():
    for arch, cfg in TINY.items():
        w = get_workload(arch)
        data = json.loads(json.dumps(cfg.to_dict()))
        assert w.config_from_dict(data) == cfg
        del data["version"]
        assert w.config_from_dict(data) == cfg  # version defaults to 1
    with pytest.raises(ValueError, match="model.config: must be a mapping"):
        get_workload("mlp").config_from_dict([1, 2])
    with pytest.raises(TypeError, match="model.config"):
        build_model("mlp", DLRMConfig.tiny(), tensorized=False)


def test_mlm_summary_reports_perplexity():
    out = get_workload("mlm").summarize({"count": 4.0, "loss_sum": 8.0, "correct": 1.0})
    assert out == {"loss": 2.0, "accuracy": 0.25, "perplexity": math.exp(2.0)}
    assert get_workload("mlm").summarize({"count": 1.0, "loss_sum": 1e4})["perplexity"] == math.inf
    assert "perplexity" not in get_workload("mlp").summarize({"count": 1.0, "loss_sum": 1.0})


def test_dlrm_loss_is_bce_with_threshold_accuracy():
    model = build_model("dlrm", TINY["dlrm"], tensorized=False).double()
    batch = to_double(batch_for("dlrm", b=16))
    step = get_workload("dlrm").forward_loss(model, batch)
    logits = raw_forward("dlrm", model, batch)
    p = torch.sigmoid(logits)
    y = batch["labels"]
    ref = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    assert abs(float(step.loss.detach()) - float(ref.detach())) < 1e-12
    assert float(step.sums["correct"]) == float(((p >= 0.5).double() == y).sum())
    assert float(step.sums["count"]) == 16
    assert abs(float(step.sums["loss_sum"]) - 16 * float(ref.detach())) < 1e-10


def test_unknown_config_fields_name_the_first_and_list_all():
    with pytest.raises(ValueError, match=r"^model\.config\.a: unknown field.*\['a', 'b'\]"):
        get_workload("mlp").config_from_dict({"b": 1, "a": 2})


def test_build_errors_name_the_compression_field():
    with pytest.raises(ValueError, match=r"^compression\.layers: pattern 'encoder\.\*'"):
        build_model(
            "mlp", TINY["mlp"], tensorized=True, options=TensorizeOptions(layers=("encoder.*",))
        )
    with pytest.raises(ValueError, match=r"^compression: cannot tensorize 'embeddings\.0'.*d "):
        build_model("dlrm", TINY["dlrm"], tensorized=True, options=TensorizeOptions(d=1))
    # dense builds ignore the options
    build_model("mlp", TINY["mlp"], tensorized=False, options=TensorizeOptions(layers=("x",)))

"""The hf_bert encoder against transformers' BertModel, pooling, TT-SVD conversion, teacher."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from engine.models.hf_bert import (
    BertEncoder,
    build_hf_bert,
    distill_loss,
    legacy_name,
    load_pretrained,
    mean_pool,
    tensorize_encoder_,
)
from engine.models.hf_bert.config import HFBertConfig
from engine.models.hf_bert.whiten import (
    balance_cores_,
    input_gram,
    whiten_tt_linears_,
    whitened_weight,
)
from engine.models.registry import TensorizeOptions, get_workload
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel
from tests.helpers.hf_bert import MINILM, minilm_dir, write_tiny_bert

SENTENCES = [
    "Return a list of all existing image names.",
    "Short one.",
    "The commands recognized by the debugger are listed in the next section of the manual.",
]


def encode(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    enc = tok.encode_batch(texts)
    n = max(len(e.ids) for e in enc)
    ids = torch.zeros(len(texts), n, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
    mask = torch.arange(n)[None, :] < torch.tensor([len(e.ids) for e in enc])[:, None]
    return ids, mask


@pytest.fixture(scope="module")
def minilm():
    cfg = HFBertConfig(path=MINILM)
    return cfg, build_hf_bert(cfg, tensorized=False, options=TensorizeOptions())


@pytest.fixture(scope="module")
def reference():
    from transformers import BertModel

    return BertModel.from_pretrained(str(minilm_dir())).eval()


def last_hidden(ref, ids, mask):
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask.long()).last_hidden_state


# -- equality with transformers ---------------------------------------------------------------
@pytest.mark.slow
def test_minilm_hidden_states_equal_transformers(minilm, reference):
    _, model = minilm
    ids, mask = encode(SENTENCES)
    with torch.no_grad():
        ours = model.eval()(ids, mask)  # (B, S, D)
    ref = last_hidden(reference, ids, mask)
    # float32: the attended positions agree to float rounding over six layers; padded
    # positions (never pooled) see transformers' additive float mask, a little more rounding
    assert_close_rel(ours[mask], ref[mask], 1e-5, "attended tokens, float32")
    assert_close_rel(ours, ref, 1e-4, "all tokens, float32")
    with torch.no_grad():  # float64: the same maths, to the last digits
        ours64 = copy.deepcopy(model).double()(ids, mask)
    ref64 = last_hidden(copy.deepcopy(reference).double(), ids, mask)
    assert_close_rel(ours64, ref64, 1e-12, "all tokens, float64")


def test_tiny_bert_equals_transformers_with_token_types(tmp_path):
    from transformers import BertModel

    write_tiny_bert(tmp_path)
    model = load_pretrained(tmp_path, HFBertConfig(path=str(tmp_path)).arch).double()
    ref = BertModel.from_pretrained(str(tmp_path)).eval().double()
    ids, mask = encode(SENTENCES)
    types = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids).contiguous()
    with torch.no_grad():
        ours = model(ids, mask, types)
        want = ref(input_ids=ids, attention_mask=mask.long(), token_type_ids=types)
    assert_close_rel(ours, want.last_hidden_state, 1e-12, "tiny BERT, float64")


def test_mean_pooling_matches_a_hand_computation():
    hidden = torch.randn(3, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    want = torch.stack([hidden[i, : int(mask[i].sum())].mean(0) for i in range(3)])
    assert torch.allclose(mean_pool(hidden, mask), want, rtol=0, atol=1e-15)
    assert torch.allclose(mean_pool(hidden, None), hidden.mean(1), rtol=0, atol=1e-15)


def test_module_names_are_transformers_and_the_earlier_names_map_onto_them(minilm):
    _, model = minilm
    names = {n for n, _ in model.named_modules()}
    assert {"embeddings.word_embeddings", "encoder.layer.5.output.dense"} <= names
    assert not any("pooler" in n for n in names)  # built without the pooler: never trained
    assert set(model.state_dict()) == set(model.bert.state_dict())  # transformers' keys
    cases = {
        "embeddings.word_embeddings": "embeddings.word",
        "encoder.layer.3.attention.self.query": "encoder.3.attn.q",
        "encoder.layer.0.attention.self.key": "encoder.0.attn.k",
        "encoder.layer.0.attention.self.value": "encoder.0.attn.v",
        "encoder.layer.0.attention.output.dense": "encoder.0.attn.out",
        "encoder.layer.5.intermediate.dense": "encoder.5.ffn.fc1",
        "encoder.layer.12.output.dense": "encoder.12.ffn.fc2",
    }
    for name, old in cases.items():
        assert legacy_name(name) == old
    for other in ("encoder.layer.0.output.LayerNorm", "embeddings.position_embeddings", "x"):
        assert legacy_name(other) is None


# -- TT-SVD conversion --------------------------------------------------------------------------
@pytest.mark.slow
def test_tt_svd_at_full_rank_reproduces_the_dense_outputs(minilm):
    _, dense = minilm
    ref = copy.deepcopy(dense).double().eval()
    tt = copy.deepcopy(ref)
    tensorize_encoder_(tt, TensorizeOptions(max_rank=1024, d=2), embeddings=False)
    ids, mask = encode(SENTENCES)
    x = torch.randn(7, 384, dtype=torch.float64)
    for row in tt.conversion:  # every layer: the same map as the dense one
        layer, want = tt.get_submodule(row["name"]), ref.get_submodule(row["name"])
        assert isinstance(layer, TTLinear) and isinstance(want, nn.Linear)
        xi = x if want.in_features == 384 else torch.randn(7, want.in_features).double()
        with torch.no_grad():
            assert_close_rel(layer(xi), want(xi), 1e-12, row["name"])
        assert row["relative_error"] < 1e-12
    with torch.no_grad():
        assert_close_rel(tt(ids, mask), ref(ids, mask), 1e-11, "whole encoder")


def test_conversion_reports_modes_ranks_params_and_respects_patterns(minilm):
    cfg, dense = minilm
    model = copy.deepcopy(dense)
    model.set_teacher(None)
    report = tensorize_encoder_(model, TensorizeOptions(max_rank=16, d=2), embeddings=False)
    assert len(report.tensorized) == 36 and not report.skipped
    for row in model.conversion:
        layer = model.get_submodule(row["name"])
        assert row["modes"] == [list(layer.in_modes), list(layer.out_modes)]
        assert row["ranks"] == list(layer.ranks) and max(row["ranks"]) == 16
        assert row["params"] == layer.tt_parameters()
        assert row["ratio"] == pytest.approx(row["dense"] / row["params"])
        assert 0 < row["relative_error"] < 1
    ffn_only = copy.deepcopy(dense)
    ffn_only.set_teacher(None)
    ffn = {
        f"encoder.layer.{i}.{n}" for i in range(6) for n in ("intermediate.dense", "output.dense")
    }
    for patterns in [  # transformers' names, and the earlier encoder's (legacy_name)
        ("encoder.layer.*.intermediate.dense", "encoder.layer.*[0-9].output.dense"),
        ("encoder.*.ffn.*",),
    ]:
        ffn_only = copy.deepcopy(dense)
        ffn_only.set_teacher(None)
        opts = TensorizeOptions(max_rank=8, layers=patterns)
        report = tensorize_encoder_(ffn_only, opts, embeddings=True)
        assert set(report.tensorized) == ffn
        skipped = {s.name for s in report.skipped}
        assert skipped >= {"embeddings.word_embeddings", "encoder.layer.0.attention.self.query"}
        assert isinstance(ffn_only.encoder.layer[0].attention.self.query, nn.Linear)
        assert isinstance(ffn_only.encoder.layer[0].output.dense, TTLinear)
    with pytest.raises(ValueError, match="layers: pattern 'decoder.*' matches no"):
        tensorize_encoder_(
            copy.deepcopy(dense), TensorizeOptions(layers=("decoder.*",)), embeddings=False
        )


def test_word_embedding_becomes_ttm_when_asked(tmp_path):
    write_tiny_bert(tmp_path)
    cfg = HFBertConfig(path=str(tmp_path), tensorize_embeddings=True)
    model = build_hf_bert(cfg, tensorized=True, options=TensorizeOptions(max_rank=8, d=2))
    rows = {r["name"]: r for r in model.conversion}
    assert rows["embeddings.word_embeddings"]["kind"] == "ttm_embedding"
    assert rows["embeddings.word_embeddings"]["ranks"][1] <= 8
    assert len(rows) == 1 + 2 * 6


def test_balance_cores_keeps_the_layer_and_evens_the_norms():
    lin = nn.Linear(48, 40).double()
    layer = TTLinear.from_linear(lin, max_rank=6, d=2)
    before = layer.to_dense().clone()
    balance_cores_(layer)
    norms = torch.stack([c.norm() for c in layer.cores])
    assert torch.allclose(norms, norms.mean().expand_as(norms), rtol=1e-12)
    assert_close_rel(layer.to_dense(), before, 1e-13, "balanced product")


# -- the teacher and the distillation loss -----------------------------------------------------
def test_teacher_stays_outside_parameters_and_state_but_follows_to(tmp_path):
    write_tiny_bert(tmp_path)
    model = build_hf_bert(
        HFBertConfig(path=str(tmp_path)), tensorized=True, options=TensorizeOptions(max_rank=4, d=2)
    )
    teacher = model.teacher
    query = teacher.encoder.layer[0].attention.self.query
    assert isinstance(teacher, BertEncoder) and not isinstance(query, TTLinear)
    own = {id(p) for p in model.parameters()}
    assert not own & {id(p) for p in teacher.parameters()}
    assert all(not k.startswith("teacher") for k in model.state_dict())
    assert not any(p.requires_grad for p in teacher.parameters())
    model.double().train()
    assert next(teacher.parameters()).dtype == torch.float64 and not teacher.training


@pytest.mark.parametrize("kind", ["cosine_embedding", "mse_hidden", "none"])
def test_distill_loss_is_zero_for_the_original_and_positive_after_tt_svd(tmp_path, kind):
    write_tiny_bert(tmp_path)
    cfg = HFBertConfig(path=str(tmp_path), distill=kind, distill_weight=2.0)
    w = get_workload("hf_bert")
    batch = w.example_batch(cfg, 4, torch.Generator().manual_seed(0), seq_len=12)
    dense = w.build(cfg, tensorized=False, options=TensorizeOptions())
    out = w.forward_loss(dense.eval(), batch)
    metrics = w.summarize({k: float(v) for k, v in out.sums.items()})
    assert metrics["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["loss"] == pytest.approx(0.0, abs=1e-5)
    tt = w.build(cfg, tensorized=True, options=TensorizeOptions(max_rank=2, d=2)).eval()
    loss, sums = distill_loss(tt, batch)
    loss.backward()
    grads = [p.grad for p in tt.parameters() if p.grad is not None]
    assert float(sums["cosine_sum"]) / 4 < 1 - 1e-5  # rank 2 changes the embeddings
    if kind == "none":
        assert loss.item() == 0.0 and all(float(g.abs().max()) == 0.0 for g in grads)
    else:
        assert loss.item() > 0 and any(float(g.abs().max()) > 0 for g in grads)


def test_a_bare_model_has_no_teacher_and_cannot_distill(tmp_path):
    write_tiny_bert(tmp_path)
    portable = HFBertConfig(path=str(tmp_path)).portable_dict()
    assert portable["path"] is None and portable["architecture"]["hidden_size"] == 32
    w = get_workload("hf_bert")
    model = w.build(portable, tensorized=True, options=TensorizeOptions(max_rank=4, d=2))
    assert model.teacher is None and model.conversion == []
    batch = w.example_batch(portable, 2)
    with pytest.raises(ValueError, match="model.config.path: distillation needs the original"):
        w.forward_loss(model, batch)


def test_whitened_tt_svd_lowers_the_output_error_and_is_exact_at_two_modes(tmp_path):
    write_tiny_bert(tmp_path)
    cfg = HFBertConfig(path=str(tmp_path), init="whitened")
    # max_rank 8 >= the outer modes (8, 4 | 4, 8): only the middle bond (the matrix rank) cuts
    model = build_hf_bert(cfg, tensorized=True, options=TensorizeOptions(max_rank=8, d=2))
    model.double()
    teacher = model.teacher
    ids, mask = encode(SENTENCES * 4)
    batches = [{"input_ids": ids, "attention_mask": mask}]
    names = [r["name"] for r in model.conversion]
    grams, seen = input_gram(teacher, names, batches, sentences=10, device=torch.device("cpu"))
    assert seen == 10 and set(grams) == set(names)
    x = teacher.get_submodule(names[0])
    keep = mask[:10]
    with torch.no_grad():  # the Gram of the first layer's inputs, by hand
        h = teacher.embeddings(ids[:10], torch.zeros_like(ids[:10]))[keep]
    assert_close_rel(grams[names[0]], h.T @ h, 1e-12, "input Gram")
    rows = whiten_tt_linears_(model, teacher, grams)
    for row in rows:
        assert row["output_error_whitened"] <= row["output_error_tt_svd"] + 1e-12, row
        layer = model.get_submodule(row["name"])
        want = whitened_weight(
            teacher.get_submodule(row["name"]).weight, grams[row["name"]], layer.ranks[2]
        )
        assert_close_rel(layer.to_dense(), want, 1e-10, row["name"])  # d = 2: exact
    assert isinstance(x, nn.Linear)

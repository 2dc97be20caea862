"""The sentence-encoder recipe's choices on the ``hf`` workload: the sensitivity allocation
within a ``target_compression`` budget, frozen embeddings and the teacher's embedding table,
each against its ``hf_bert`` counterpart or plain recomputation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.configs import ConfigError
from engine.models.hf import HFConfig, build_hf
from engine.models.hf.from_hf_bert import hf_bert_to_hf
from engine.models.hf.losses import hf_loss
from engine.models.hf.prepare import prepare_hf_
from engine.models.hf_bert import prepare_student_
from engine.models.hf_bert.cache import attach_teacher_embeddings_
from engine.models.hf_bert.config import HFBertConfig
from engine.models.registry import get_workload
from engine.models.tensorize import TensorizeOptions
from engine.train.config import StageConfig
from tests.helpers.hf_models import make_model_dir, tiny_config

CPU = torch.device("cpu")
EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "engine"
MATRIX = TensorizeOptions(max_rank=64, min_size=1, d=1)  # full rank: the budget decides


def _batches(cfg: HFConfig, n: int = 6) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [get_workload("hf").example_batch(cfg, 8, g, seq_len=16) for _ in range(n)]


def _encoder(directory, **kw) -> tuple:
    cfg = HFConfig(path=str(directory), task="sentence_embedding", calibration_sentences=32, **kw)
    return build_hf(cfg, tensorized=True, options=MATRIX).eval().double(), cfg


def _entries(model) -> int:
    names = model.tensorize_report.tensorized
    return sum(c.numel() for n in names for c in model.net.get_submodule(n).cores)


def _dense(model) -> int:
    names = model.tensorize_report.tensorized
    return sum(model.net.get_submodule(n).dense_parameters() for n in names)


def test_the_sensitivity_allocation_matches_hf_berts_within_the_target(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    recipe = {  # an hf_bert recipe, then the same on hf
        "path": str(directory),
        "init": "sequential",
        "rank_allocation": "sensitivity",
        "target_compression": 3.0,
        "probe_sentences": 8,
        "calibration_sentences": 32,
        "train_embeddings": False,
    }
    cfg = HFConfig.from_dict(hf_bert_to_hf(recipe))
    model = build_hf(cfg, tensorized=True, options=MATRIX).eval().double()
    batches = _batches(cfg)
    info = prepare_hf_(model, batches, device=CPU)
    alloc = info["allocation"]
    dense = sum(
        model.net.get_submodule(n).dense_parameters() for n in model.tensorize_report.tensorized
    )
    assert alloc["rank_allocation"] == "sensitivity" and alloc["budget"] == int(dense / 3.0)
    assert _entries(model) == alloc["tt_params"] <= alloc["budget"]
    assert alloc["probe_sentences"] == 8 and len(alloc["sensitivity"][0]) == 12
    ranks = {n: model.net.get_submodule(n).ranks[1] for n in model.tensorize_report.tensorized}
    assert len(set(ranks.values())) > 1

    # hf_bert's recipe on the same directory and sentences allocates the same ranks
    ref_cfg = HFBertConfig.from_dict(recipe)
    ref = get_workload("hf_bert").build(ref_cfg, tensorized=True, options=MATRIX).eval().double()
    ref_info = prepare_student_(ref, batches, device=CPU)
    assert ref_info["ranks"] == ranks == info["ranks"]
    assert ref_info["sensitivity"] == alloc["sensitivity"]
    # and after the sequential fit the same encoder: the same last hidden states
    with torch.no_grad():
        for b in batches[:2]:
            args = (b["input_ids"], b["attention_mask"], b["token_type_ids"])
            torch.testing.assert_close(model(*args), ref(*args), rtol=1e-6, atol=1e-8)


def test_the_shipped_recipe_on_hf_is_hf_berts_mapped():
    def job(name: str) -> dict:
        return json.loads((EXAMPLES / name).read_text())

    bert, hf = job("minilm_hf.json"), job("minilm_hf_recipe.json")
    assert hf["model"] == {"arch": "hf", "config": hf_bert_to_hf(bert["model"]["config"])}
    assert {k: v for k, v in hf.items() if k not in ("model", "name")} == {
        k: v for k, v in bert.items() if k not in ("model", "name")
    }
    with pytest.raises(ConfigError, match="distill: 'mse_hidden' has no hf counterpart"):
        hf_bert_to_hf({**bert["model"]["config"], "distill": "mse_hidden"})


def test_a_target_compression_sets_the_energy_budget(tmp_path):
    directory = make_model_dir(tmp_path, "llama")
    cfg = HFConfig(
        path=str(directory),
        calibration_sentences=32,
        rank_allocation="energy",
        target_compression=4.0,
    )
    model = build_hf(cfg, tensorized=True, options=MATRIX).eval()
    info = prepare_hf_(model, _batches(cfg), device=CPU)
    dense = sum(
        model.net.get_submodule(n).dense_parameters() for n in model.tensorize_report.tensorized
    )
    assert info["allocation"]["budget"] == int(dense / 4.0)
    # the greedy allocation stops within one rank step of the budget
    assert 0.9 * dense / 4.0 <= _entries(model) <= dense / 4.0


def test_the_recipes_options_are_refused_where_they_do_not_apply(tmp_path):
    bert = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    llama = make_model_dir(tmp_path, "llama")
    with pytest.raises(ConfigError, match="target_compression: needs rank_allocation"):
        HFConfig(path=str(llama), target_compression=4.0)
    with pytest.raises(ConfigError, match="'sensitivity' probes the sentence embedding"):
        HFConfig(path=str(llama), rank_allocation="sensitivity")
    with pytest.raises(ConfigError, match="'sensitivity' probes the sentence embedding"):
        HFConfig(path=str(bert), task="masked_lm", rank_allocation="sensitivity")
    with pytest.raises(ConfigError, match="train_embeddings: must be true"):
        HFConfig(path=str(llama), tensorize_embeddings=True, train_embeddings=False)
    portable = HFConfig(
        path=str(bert),
        task="sentence_embedding",
        rank_allocation="sensitivity",
        target_compression=5,
    ).portable_dict()
    assert HFConfig.from_dict(portable).target_compression is None


@pytest.mark.parametrize(
    ("model_type", "task", "frozen"),
    [
        ("bert", "masked_lm", ["bert.embeddings"]),
        ("distilbert", "sequence_classification", ["distilbert.embeddings"]),
        ("gpt2", "causal_lm", ["transformer.wte", "transformer.wpe"]),
        ("llama", "causal_lm", ["model.embed_tokens"]),
    ],
)
def test_frozen_embeddings_get_no_gradient_and_the_rest_does(model_type, task, frozen):
    config = {**tiny_config(model_type), "num_labels": 3}
    cfg = HFConfig(hf_config=config, task=task, train_embeddings=False, mask_token_id=3)
    model = build_hf(cfg, tensorized=True, options=TensorizeOptions(max_rank=4, min_size=1))
    assert model.frozen == frozen
    g = torch.Generator().manual_seed(0)
    loss, _ = hf_loss(model, get_workload("hf").example_batch(cfg, 4, g, seq_len=8))
    loss.backward()
    for name, p in model.net.named_parameters():
        inside = any(name.startswith(f + ".") for f in frozen)
        assert p.requires_grad != inside, name
        assert (p.grad is None) == inside, name
    table = model.net.get_input_embeddings().weight
    assert not table.requires_grad and table.grad is None


def test_the_teacher_table_stands_in_for_the_teacher(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    model, cfg = _encoder(directory)
    model.float()
    batch = _batches(cfg, 1)[0]
    want, want_sums = hf_loss(model, batch)  # the teacher runs
    stages = [StageConfig.from_dict({"kind": "finetune", "steps": 4}, "schedule[0]")]
    source = SimpleNamespace(num_examples=lambda: 8, batches=lambda epoch: iter([batch]))
    info = attach_teacher_embeddings_(model, source, stages, 8, device=CPU)
    assert info["teacher_embeddings"] == 8
    calls = []
    hook = model.teacher.register_forward_hook(lambda *a: calls.append(1))
    got, got_sums = hf_loss(model, batch)
    assert calls == []  # every sentence found: the teacher did not run
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_sums["cosine_sum"], want_sums["cosine_sum"])
    other = _batches(cfg, 2)[1]  # sentences the table does not hold: the teacher runs
    hf_loss(model, other)
    hook.remove()
    assert calls == [1]
    lm = HFConfig(path=str(make_model_dir(tmp_path, "llama")))
    causal = build_hf(lm, tensorized=False, options=TensorizeOptions())
    assert attach_teacher_embeddings_(causal, source, stages, 8, device=CPU) is None


def test_token_weight_adds_each_tokens_cosine_to_the_pooled_one(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    plain, cfg = _encoder(directory)
    tokens, _ = _encoder(directory, token_weight=0.5)
    tokens.load_state_dict(plain.state_dict())
    batch = _batches(cfg, 1)[0]
    base, sums = hf_loss(plain, batch)
    got, got_sums = hf_loss(tokens, batch)
    with torch.no_grad():  # the per-token term recomputed from the two models' hidden states
        args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        h = tokens(*args)  # (B, S, D)
        t = tokens.call(tokens.teacher, *args).last_hidden_state  # (B, S, D)
        keep = batch["attention_mask"].bool()  # (B, S)
        per = 1 - torch.nn.functional.cosine_similarity(h[keep], t[keep], dim=-1)  # (N,)
    torch.testing.assert_close(got, base + 0.5 * per.mean())
    torch.testing.assert_close(got_sums["cosine_sum"], sums["cosine_sum"])  # the metric stays
    assert tokens.cached_distillation() is None  # every token's: no table stands in

"""The ``hf`` objectives against transformers' own losses and first principles."""

from __future__ import annotations

import pytest
import torch

from engine.models.hf import HFConfig, build_hf, hf_loss
from engine.models.hf.losses import lm_mask
from engine.models.registry import get_workload
from engine.models.tensorize import TensorizeOptions
from tests.helpers.hf_models import VOCAB, make_model_dir, tiny_config

OPTS = TensorizeOptions(max_rank=4, min_size=1)


def _ids(b: int = 3, s: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_causal_nll_is_transformers_own_loss(model_type):
    model = build_hf(
        HFConfig(hf_config=tiny_config(model_type)), tensorized=True, options=OPTS
    ).eval()
    ids = _ids()
    mask = torch.ones_like(ids, dtype=torch.bool)
    loss, sums = hf_loss(model, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        want = model.net(input_ids=ids, labels=ids).loss  # shifts inside
    assert sums["count"] == ids.numel() - ids.shape[0]
    assert torch.allclose(sums["nll_sum"] / sums["count"], want, atol=1e-5)
    assert torch.allclose(loss, want, atol=1e-5)  # no teacher: the task loss alone
    metrics = get_workload("hf").summarize({k: float(v) for k, v in sums.items()})
    assert metrics["perplexity"] == pytest.approx(float(want.exp()), rel=1e-5)


def test_padded_positions_are_not_predicted():
    model = build_hf(HFConfig(hf_config=tiny_config("llama")), tensorized=False, options=OPTS)
    ids = _ids(b=2)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 5:] = False
    _, sums = hf_loss(model.eval(), {"input_ids": ids, "attention_mask": mask})
    assert sums["count"] == (ids.shape[1] - 1) + 4


def test_distillation_from_an_identical_teacher_adds_nothing(tmp_path):
    """A dense student built from the directory equals its teacher: KL 0, loss = NLL."""
    directory = make_model_dir(tmp_path, "llama")
    model = build_hf(HFConfig(path=str(directory)), tensorized=False, options=OPTS).eval()
    assert model.teacher is not None
    ids = _ids()
    loss, sums = hf_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids) > 0})
    assert torch.allclose(loss * sums["count"], sums["nll_sum"], rtol=1e-5)


def test_distillation_pulls_a_compressed_student_towards_the_teacher(tmp_path):
    directory = make_model_dir(tmp_path, "gpt2")
    student = build_hf(HFConfig(path=str(directory)), tensorized=True, options=OPTS).eval()
    only_task = build_hf(
        HFConfig(path=str(directory), distill_weight=0.0), tensorized=True, options=OPTS
    ).eval()
    ids = _ids()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids) > 0}
    with_kl, sums = hf_loss(student, batch)
    without, _ = hf_loss(only_task, batch)
    assert with_kl > without  # the same student (same TT-SVD), plus a positive KL term
    assert torch.allclose(without * sums["count"], sums["nll_sum"], rtol=1e-5)


def test_lm_mask_is_a_function_of_each_row_alone():
    ids = _ids(b=6, s=40)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, 30:] = False
    chosen = lm_mask(ids, mask)
    perm = torch.tensor([5, 3, 1, 0, 2, 4])
    assert torch.equal(lm_mask(ids[perm], mask[perm]), chosen[perm])
    assert not chosen[:, 0].any() and not chosen[2, 29:].any() and not chosen[:, -1].any()
    assert chosen.any(1).all()
    rate = chosen.sum() / (mask.sum() - 2 * 6)
    assert 0.05 < rate < 0.3


def test_masked_lm_scores_only_the_masked_positions():
    cfg = HFConfig(task="masked_lm", hf_config=tiny_config("bert"), mask_token_id=4)
    model = build_hf(cfg, tensorized=True, options=OPTS).eval()
    ids = _ids(s=20)
    mask = torch.ones_like(ids, dtype=torch.bool)
    loss, sums = hf_loss(model, {"input_ids": ids, "attention_mask": mask})
    chosen = lm_mask(ids, mask)
    with torch.no_grad():
        logits = model.net(input_ids=ids.masked_fill(chosen, 4)).logits  # (B, S, V)
    want = torch.nn.functional.cross_entropy(logits[chosen], ids[chosen])
    assert sums["count"] == chosen.sum()
    assert torch.allclose(loss, want, atol=1e-5)


def test_classification_is_cross_entropy_on_the_heads_logits():
    cfg = HFConfig(
        task="sequence_classification", hf_config=tiny_config("gpt2"), num_labels=3, pad_token_id=0
    )
    model = build_hf(cfg, tensorized=True, options=OPTS).eval()
    ids = _ids()
    mask = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.tensor([0, 2, 1])
    loss, sums = hf_loss(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    with torch.no_grad():
        want = model.net(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    assert torch.allclose(loss, want, atol=1e-5)
    assert sums["count"] == 3


def test_sentence_embedding_of_the_original_itself_has_cosine_one(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    model = build_hf(
        HFConfig(task="sentence_embedding", path=str(directory)), tensorized=False, options=OPTS
    ).eval()
    ids = _ids()
    loss, sums = hf_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids) > 0})
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    assert float(sums["cosine_sum"]) == pytest.approx(3.0, abs=1e-5)


def test_sentence_embedding_needs_the_original():
    from engine.configs import ConfigError

    cfg = HFConfig(task="sentence_embedding", hf_config=tiny_config("bert"))
    model = build_hf(cfg, tensorized=False, options=OPTS)
    ids = _ids()
    with pytest.raises(ConfigError, match="model.config.task"):
        hf_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids) > 0})

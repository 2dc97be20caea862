"""The generic swap on transformers' own classes: exact at full rank for every family,
Conv1D transposed, refusals that name the module or field."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.configs import ConfigError
from engine.models.hf import FAMILIES, HFConfig, build_hf
from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from tests.helpers.hf_models import VOCAB, tiny_config

TASK = {
    "bert": "masked_lm",
    "roberta": "masked_lm",
    "distilbert": "masked_lm",
    "gpt2": "causal_lm",
    "llama": "causal_lm",
    "mistral": "causal_lm",
    "qwen2": "causal_lm",
}
FULL = TensorizeOptions(max_rank=1024, min_size=1)  # TT-SVD without truncation: exact


def _config(model_type: str, **kw) -> HFConfig:
    return HFConfig(task=kw.pop("task", TASK[model_type]), hf_config=tiny_config(model_type), **kw)


def _batch(seq: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, seq), generator=g)  # (B, S)
    mask = torch.ones(3, seq, dtype=torch.bool)
    mask[1, 7:] = False  # (B, S) one padded row
    return ids, mask


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_full_rank_swap_reproduces_the_dense_model(model_type):
    """The same seed builds the same dense weights; the TT-SVD at full rank is exact, so the
    tensorized model's logits equal the dense model's (Conv1D's (in, out) transposed)."""
    cfg = _config(model_type)
    torch.manual_seed(0)
    dense = build_hf(cfg, tensorized=False, options=FULL).eval()
    # the tensorized build starts from the same dense weights: swap from them
    from engine.models.hf.swap import tensorize_hf_

    tt = build_hf(cfg, tensorized=False, options=FULL).eval()
    tt.net.load_state_dict(dense.net.state_dict())
    report, rows, kinds = tensorize_hf_(tt.net, cfg, FULL, from_weights=True)
    family = FAMILIES[model_type]
    assert report.tensorized and all(family.is_target(n) for n in report.tensorized)
    n_blocks = tiny_config(model_type).get(family.layers_field)
    per_block = {"gpt2": 4}.get(model_type, len(family.linears))
    assert len(report.tensorized) == n_blocks * per_block
    assert set(kinds.values()) == ({"conv1d"} if model_type == "gpt2" else {"linear"})
    assert max(r["relative_error"] for r in rows) < 1e-5
    ids, mask = _batch()
    with torch.no_grad():
        want, got = dense(ids, mask), tt(ids, mask)  # (B, S, V)
    assert torch.allclose(got[mask], want[mask], atol=1e-4, rtol=1e-4)


def test_compression_layers_filter_the_family_targets():
    cfg = _config("llama")
    opts = TensorizeOptions(max_rank=4, min_size=1, layers=("*.mlp.*",))
    model = build_hf(cfg, tensorized=True, options=opts)
    done = model.tensorize_report.tensorized
    assert done and all(".mlp." in n for n in done)
    skipped = {s.name for s in model.tensorize_report.skipped}
    assert "model.layers.0.self_attn.q_proj" in skipped
    assert isinstance(model.net.get_submodule("model.layers.0.mlp.up_proj"), TTLinear)
    assert isinstance(model.net.get_submodule("model.layers.0.self_attn.q_proj"), nn.Linear)


def test_lm_head_is_tensorized_only_on_request():
    off = build_hf(_config("gpt2"), tensorized=True, options=TensorizeOptions(min_size=1))
    assert "lm_head" not in off.tensorize_report.tensorized
    on = build_hf(
        _config("gpt2", tensorize_lm_head=True),
        tensorized=True,
        options=TensorizeOptions(min_size=1),
    )
    assert "lm_head" in on.tensorize_report.tensorized


def test_a_target_that_is_not_a_linear_names_the_module():
    with pytest.raises(ConfigError, match=r"targets.*'model.norm' is a LlamaRMSNorm"):
        build_hf(_config("llama", targets=("norm",)), tensorized=True, options=FULL)


def test_a_target_that_names_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"targets.*'nonexistent' names no module"):
        build_hf(_config("llama", targets=("nonexistent",)), tensorized=True, options=FULL)


def test_a_pattern_matching_no_candidate_is_refused():
    opts = TensorizeOptions(layers=("*.typo.*",))
    with pytest.raises(ConfigError, match="layers"):
        build_hf(_config("bert"), tensorized=True, options=opts)

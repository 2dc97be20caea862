"""The activation-aware start of a pretrained ``hf`` student against plain TT-SVD."""

from __future__ import annotations

import pytest
import torch

from engine.models.hf import HFConfig, build_hf
from engine.models.hf.prepare import prepare_hf_
from engine.models.registry import get_workload
from engine.models.tensorize import TensorizeOptions
from tests.helpers.hf_models import make_model_dir

OPTS = TensorizeOptions(max_rank=3, min_size=1)
# one mode a side: the TT is a rank-r matrix, whose only bond the whitened truncation solves
# exactly; with more modes the inner bonds truncate too and per-layer optimality is lost
MATRIX = TensorizeOptions(max_rank=3, min_size=1, d=1)
CPU = torch.device("cpu")


def _batches(cfg: HFConfig, n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [get_workload("hf").example_batch(cfg, 8, g, seq_len=16) for _ in range(n)]


def _output_gap(model, batches) -> float:
    """Mean squared logit difference to the teacher over attended positions."""
    total = 0.0
    with torch.no_grad():
        for b in batches:
            mask = b["attention_mask"]
            got = model(b["input_ids"], mask)  # (B, S, V)
            want = model.call(model.teacher, b["input_ids"], mask).logits  # (B, S, V)
            total += float(((got - want)[mask] ** 2).mean())
    return total / len(batches)


def _pair(directory, options):
    plain = build_hf(
        HFConfig(path=str(directory), init="tt_svd"), tensorized=True, options=options
    ).eval()
    cfg = HFConfig(path=str(directory), calibration_sentences=32)
    return plain, build_hf(cfg, tensorized=True, options=options).eval(), cfg


def test_the_whitened_start_fits_the_teachers_outputs_better(tmp_path):
    for family in ("gpt2", "llama"):  # Conv1D and nn.Linear
        directory = make_model_dir(tmp_path, family)
        plain, aware, cfg = _pair(directory, MATRIX)
        batches = _batches(cfg)
        assert prepare_hf_(plain, batches, device=CPU) is None  # tt_svd: nothing to do
        info = prepare_hf_(aware, batches, device=CPU)
        assert info["calibration_sentences"] == 32
        rows = info["layers"]
        assert len(rows) == len(aware.tensorize_report.tensorized)
        for row in rows:  # per layer: the whitened truncation has the smaller output error
            assert row["output_error_whitened"] <= row["output_error_tt_svd"] + 1e-9, row
        # the ranks (and so the size) do not change
        for name in aware.tensorize_report.tensorized:
            assert aware.net.get_submodule(name).ranks == plain.net.get_submodule(name).ranks
        assert _output_gap(aware, batches) < _output_gap(plain, batches)


def test_with_more_modes_the_whole_model_still_fits_better(tmp_path):
    directory = make_model_dir(tmp_path, "llama")
    plain, aware, cfg = _pair(directory, OPTS)
    batches = _batches(cfg)
    prepare_hf_(aware, batches, device=CPU)
    assert _output_gap(aware, batches) < _output_gap(plain, batches)


def _hidden_gap(model, batches) -> float:
    """Relative error of the last hidden states to the teacher's over attended tokens."""
    num = den = 0.0
    with torch.no_grad():
        for b in batches:
            mask = b["attention_mask"].bool()
            got = model(b["input_ids"], b["attention_mask"])  # (B, S, D)
            want = model.call(model.teacher, b["input_ids"], b["attention_mask"])
            diff = (got - want.last_hidden_state)[mask]  # (N, D)
            num += float((diff**2).sum())
            den += float((want.last_hidden_state[mask] ** 2).sum())
    return (num / den) ** 0.5


def test_the_sequential_start_of_a_bert_sentence_encoder(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")

    def built(init: str, max_rank: int):
        cfg = HFConfig(
            path=str(directory), task="sentence_embedding", init=init, calibration_sentences=32
        )
        opts = TensorizeOptions(max_rank=max_rank, min_size=1, d=1)
        return build_hf(cfg, tensorized=True, options=opts).eval().double(), cfg

    full, cfg = built("sequential", 64)  # every rank full: the original, up to the fit's ridge
    batches = _batches(cfg)
    info = prepare_hf_(full, batches, device=CPU)
    assert info["init"] == "sequential" and info["calibration_sentences"] == 32
    assert [r["name"] for r in info["layers"]] == list(full.tensorize_report.tensorized)
    assert _hidden_gap(full, batches) < 1e-3
    seq, _ = built("sequential", 3)
    whitened, _ = built("whitened", 3)
    prepare_hf_(seq, batches, device=CPU)
    prepare_hf_(whitened, batches, device=CPU)
    for name in seq.tensorize_report.tensorized:  # same ranks, so the same size
        assert seq.net.get_submodule(name).ranks == whitened.net.get_submodule(name).ranks
    assert _hidden_gap(seq, batches) < _hidden_gap(whitened, batches)


def test_the_sequential_start_is_for_bert_sentence_encoders_only(tmp_path):
    import pytest

    from engine.configs import ConfigError

    bert, llama = make_model_dir(tmp_path, "bert"), make_model_dir(tmp_path, "llama")
    for directory, task in [(bert, "masked_lm"), (llama, "causal_lm")]:
        with pytest.raises(ConfigError, match="init: 'sequential' needs a pretrained encoder"):
            HFConfig(path=str(directory), task=task, init="sequential")


def _tt_entries(model) -> int:
    names = model.tensorize_report.tensorized
    return sum(c.numel() for n in names for c in model.net.get_submodule(n).cores)


def test_energy_allocation_spends_the_uniform_budget_where_the_spectra_need_it(tmp_path):
    directory = make_model_dir(tmp_path, "llama")
    _, uniform, cfg = _pair(directory, MATRIX)
    energy_cfg = HFConfig(path=str(directory), calibration_sentences=32, rank_allocation="energy")
    energy = build_hf(energy_cfg, tensorized=True, options=MATRIX).eval()
    batches = _batches(cfg)
    base = prepare_hf_(uniform, batches, device=CPU)
    info = prepare_hf_(energy, batches, device=CPU)
    alloc = info["allocation"]
    assert "allocation" not in base
    # the budget is the uniform build's TT entries, and the allocation stays within it
    assert alloc["budget"] == _tt_entries(uniform)
    assert _tt_entries(energy) == alloc["tt_params"] <= alloc["budget"]
    ranks = {r["name"]: r["rank"] for r in info["layers"]}
    assert {r["built_rank"] for r in info["layers"]} == {3} and len(set(ranks.values())) > 1
    for name, rank in ranks.items():  # one mode a side: the rank is the middle bond
        assert energy.net.get_submodule(name).ranks == (1, rank, 1)

    # with one mode a side each layer's squared relative output error is the energy its
    # truncation leaves out: the layers' sum is the allocation's objective, below uniform's
    def left_out(rows):
        return sum(r["output_error_whitened"] ** 2 for r in rows)

    assert left_out(info["layers"]) == pytest.approx(alloc["energy_left_out"], rel=1e-3)
    assert left_out(base["layers"]) == pytest.approx(alloc["energy_left_out_uniform"], rel=1e-3)
    assert alloc["energy_left_out"] < alloc["energy_left_out_uniform"]


def test_energy_allocation_needs_the_whitened_pretrained_start(tmp_path):
    from engine.configs import ConfigError

    directory = make_model_dir(tmp_path, "llama")
    with pytest.raises(ConfigError, match="rank_allocation: 'energy' needs a pretrained start"):
        HFConfig(path=str(directory), init="tt_svd", rank_allocation="energy")
    config = HFConfig(path=str(directory)).config_json
    with pytest.raises(ConfigError, match="rank_allocation: 'energy' needs a pretrained start"):
        HFConfig(hf_config=config, rank_allocation="energy")


def test_energy_allocation_then_the_sequential_fit_at_the_allocated_ranks(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    opts = TensorizeOptions(max_rank=3, min_size=1, d=1)

    def built(allocation: str, init: str = "sequential"):
        cfg = HFConfig(
            path=str(directory),
            task="sentence_embedding",
            init=init,
            calibration_sentences=32,
            rank_allocation=allocation,
        )
        return build_hf(cfg, tensorized=True, options=opts).eval().double(), cfg

    uniform, cfg = built("uniform")
    energy, _ = built("energy")
    whitened, _ = built("energy", "whitened")
    batches = _batches(cfg)
    prepare_hf_(uniform, batches, device=CPU)
    info = prepare_hf_(energy, iter(batches), device=CPU)  # a one-pass iterator, read twice
    alloc = info["allocation"]
    assert info["init"] == "sequential" and info["calibration_sentences"] == 32
    assert alloc["budget"] == _tt_entries(uniform) and _tt_entries(energy) == alloc["tt_params"]
    assert alloc["tt_params"] <= alloc["budget"]
    assert alloc["energy_left_out"] < alloc["energy_left_out_uniform"]
    ranks = {n: energy.net.get_submodule(n).ranks[1] for n in energy.tensorize_report.tensorized}
    assert len(set(ranks.values())) > 1  # spread, not uniform
    # the whitened start allocates the same ranks; the sequential fit then does better on them
    assert prepare_hf_(whitened, batches, device=CPU)["allocation"] == alloc
    for name, rank in ranks.items():
        assert whitened.net.get_submodule(name).ranks == (1, rank, 1)
    assert _hidden_gap(energy, batches) < _hidden_gap(whitened, batches)

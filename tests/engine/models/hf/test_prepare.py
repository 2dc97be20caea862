"""The activation-aware start of a pretrained ``hf`` student against plain TT-SVD."""

from __future__ import annotations

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

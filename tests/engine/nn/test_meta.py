"""``engine.nn.meta.on_meta``: the same shapes as a real build, no random fill on meta tensors
(a real tensor made inside is still filled), and a plan that never imports ``torch._dynamo``
(the first ``normal_`` on a meta tensor did, ~1.5 s of a core in every planner child and
every worker job)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from engine.nn.meta import on_meta
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.helpers.services import run_python
from tests.helpers.specs import engine_job, mlp_model, transformer_model


def _build() -> nn.Module:
    return nn.ModuleDict(
        {
            "emb": nn.Embedding(50, 8, padding_idx=0),
            "lin": nn.Linear(8, 6),
            "tt": TTLinear(16, 12, max_rank=3),
            "ttm": TTMEmbedding(64, 16, max_rank=3),
            "norm": nn.LayerNorm(8),
        }
    )


def test_a_meta_build_has_the_shapes_and_dtypes_of_a_real_one():
    real = _build()
    with on_meta():
        meta = _build()
    got = {k: (v.shape, v.dtype, v.device.type) for k, v in meta.state_dict().items()}
    want = {k: (v.shape, v.dtype, "meta") for k, v in real.state_dict().items()}
    assert got == want


def test_only_meta_tensors_skip_their_random_fill():
    with on_meta():
        meta = torch.empty(3, 4)
        assert meta.normal_(0.0, 1.0) is meta
        real = torch.zeros(3, 4, device="cpu")
        real.normal_(0.0, 1.0)
        nn.init.uniform_(kept := torch.zeros(5, device="cpu"), 1.0, 2.0)
    assert meta.is_meta
    assert real.abs().sum() > 0
    assert bool(((kept >= 1.0) & (kept <= 2.0)).all())


PLAN = """
import json, sys
from worker.plan import plan_job
plan = plan_job(json.loads(sys.argv[1]))
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "layers": len(plan["layers"])}))
"""


@pytest.mark.parametrize(
    "model", [mlp_model(32, 32), transformer_model()], ids=["mlp", "transformer"]
)
def test_a_plan_in_a_fresh_process_never_imports_dynamo(model):
    job = engine_job(model=model, compression={"max_rank": 4})
    out = run_python("-c", PLAN, json.dumps(job))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["layers"] > 0  # tensorized layers were planned
    assert result["dynamo"] is False

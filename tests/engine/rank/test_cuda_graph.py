"""On a GPU: penalty, size and the late objective never sync with the host and replay in a graph."""

from __future__ import annotations

import random

import pytest
import torch

from engine.rank.objectives import late_objective
from engine.rank.penalty import PENALTIES, GateIndex
from engine.rank.size import model_size
from tests.engine.rank.models import Tiny, gates_of, randomize_gates_

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("variant", PENALTIES)
def test_no_sync_and_graph_replay_follows_gate_values(variant):
    model = Tiny(dtype=torch.float32).cuda()
    index = GateIndex(model, variant)
    loss = torch.tensor(1.3, device="cuda")
    loss_ref, size_ref = torch.tensor(0.8, device="cuda"), torch.tensor(50.0, device="cuda")

    def compute():
        r, s = index.penalty(), index.size()
        j, lam = late_objective(loss, r, s, loss_ref, size_ref)
        return r, s, index.active_entries(), j, lam

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync raises
    try:
        compute()
    finally:
        torch.cuda.set_sync_debug_mode("default")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        compute()  # warm-up off the default stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static = compute()

    rng = random.Random(0)
    for _ in range(3):
        randomize_gates_(model, rng, p_dead=0.3)  # in place: same storage the graph reads
        graph.replay()
        with torch.no_grad():
            eager = compute()
        for a, b in zip(static, eager, strict=True):
            assert torch.allclose(a, b, rtol=1e-6, atol=0)
        assert float(static[1]) == model_size(model)
    assert gates_of(model)[0].is_cuda

"""The deployment measures against what can be counted by hand."""

from __future__ import annotations

import torch
from torch import nn

from engine.measure import peak_tensor_bytes, time_forward

CPU = torch.device("cpu")


def test_peak_counts_parameters_and_every_live_output():
    lin = nn.Linear(512, 2048)
    x = torch.randn(64, 512)
    params = (512 * 2048 + 2048) * 4
    out = 64 * 2048 * 4
    # linear's output is alive while relu writes its own: two outputs at the peak
    assert peak_tensor_bytes(lin, lambda: torch.relu(lin(x)), CPU) == params + 2 * out
    # an in-place relu allocates nothing more
    assert peak_tensor_bytes(lin, lambda: torch.relu_(lin(x)), CPU) == params + out


def test_freed_intermediates_do_not_add_up():
    lin = nn.Linear(256, 256, bias=False)
    x = torch.randn(32, 256)
    step = 32 * 256 * 4

    def chain():
        y = x
        for _ in range(10):
            y = lin(y)  # the previous y is freed as the next is made
        return y

    peak = peak_tensor_bytes(lin, chain, CPU)
    assert peak == 256 * 256 * 4 + 2 * step


def test_views_share_their_storage():
    lin = nn.Linear(64, 64)
    x = torch.randn(8, 64)
    params = (64 * 64 + 64) * 4
    assert peak_tensor_bytes(lin, lambda: lin(x).view(-1).t(), CPU) == params + 8 * 64 * 4


def test_time_forward_times_each_call():
    calls = (lambda: torch.randn(10), lambda: torch.randn(200_000).sort())
    fast, slow = time_forward(calls, CPU, repeats=3)
    assert 0 < fast < slow

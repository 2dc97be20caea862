"""The cubic size bound of gradual pruning."""

from __future__ import annotations

import pytest

from engine.rank.schedule import size_bound


def test_bound_runs_from_s0_to_the_target_along_the_cubic():
    s0, target, total = 1000.0, 200.0, 400
    values = [size_bound(t, total, s0, target, begin=0.0, end=0.75) for t in range(total + 1)]
    assert values[0] == s0 and values[300] == target and values[-1] == target
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))  # never rises
    for t in (30, 150, 270):
        u = t / 300
        assert values[t] == pytest.approx(target + (s0 - target) * (1 - u) ** 3, rel=1e-12)
    # fastest right after the start: the first tenth of the ramp removes > 1/4 of the gap
    assert s0 - values[30] > 0.25 * (s0 - target)


def test_bound_waits_until_begin_and_handles_degenerate_cases():
    assert size_bound(39, 400, 1000.0, 200.0, begin=0.1, end=0.75) == 1000.0
    assert size_bound(40, 400, 1000.0, 200.0, begin=0.1, end=0.75) == 1000.0
    assert size_bound(41, 400, 1000.0, 200.0, begin=0.1, end=0.75) < 1000.0
    assert size_bound(5, 0, 1000.0, 200.0) == 1000.0  # unknown length: no cut
    assert size_bound(5, 10, 100.0, 200.0) == 100.0  # already below the target
    for begin, end in ((0.5, 0.5), (-0.1, 0.5), (0.2, 1.5)):
        with pytest.raises(ValueError, match="begin"):
            size_bound(1, 10, 100.0, 50.0, begin=begin, end=end)

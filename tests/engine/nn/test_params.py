"""ParamList reads the same entries as nn.ParameterList, in the same order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.nn.params import ParamList


def _pair(n: int) -> tuple[ParamList, nn.ParameterList]:
    ps = [nn.Parameter(torch.full((i + 1,), float(i))) for i in range(n)]
    return ParamList(ps), nn.ParameterList(ps)


def _same(fast: ParamList, base: nn.ParameterList) -> None:
    assert len(fast) == len(base)
    assert [id(p) for p in fast] == [id(p) for p in base]
    for i in range(-len(base), len(base)):
        assert fast[i] is base[i]
    assert list(fast.state_dict()) == list(base.state_dict())


def test_iteration_and_indexing_match_the_base_class():
    _same(*_pair(12))  # keys "10", "11" sort before "2" as strings


def test_after_append_extend_and_setitem():
    fast, base = _pair(3)
    extra = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.ones(3))]
    for lst in (fast, base):
        lst.append(extra[0])
        lst.extend([extra[1]])
    _same(fast, base)
    new = nn.Parameter(torch.arange(4.0))
    fast[1] = new
    base[1] = new
    fast[-1] = extra[0]
    base[-1] = extra[0]
    _same(fast, base)
    assert fast[1] is new and list(fast)[1] is new


def test_slices_and_bad_indices_behave_as_the_base_class():
    fast, base = _pair(4)
    assert [id(p) for p in fast[1:3]] == [id(p) for p in base[1:3]]
    for bad in (4, -5):
        with pytest.raises(IndexError):
            fast[bad]
        with pytest.raises(IndexError):
            base[bad]


def test_a_plain_tensor_entry_falls_back():
    fast, base = _pair(2)
    t = torch.zeros(3)  # ParameterList wraps tensors as Parameters
    fast.append(t)
    base.append(t)
    assert [p.shape for p in fast] == [p.shape for p in base]
    assert isinstance(fast[2], nn.Parameter)

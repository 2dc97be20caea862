"""Building modules on the ``meta`` device without running their random initializers.

A model built on ``meta`` has shapes and no values, so drawing its random start is wasted
work; worse, the first ``normal_`` on a meta tensor runs through ``torch._refs``, whose
wrapper imports ``torch._dynamo`` (about 1.5 s of a core, once per process). Every plan of a
job, in the API's planner children and again in the worker's fresh child per job, paid that
import for an ``nn.Embedding`` or a TT core that nobody reads (a worker's job imports it
anyway when it builds its optimizer; the planner children never need it). :func:`on_meta`
builds on the meta device and turns the random initializers into no-ops for meta tensors only;
:func:`engine.tt.cores.init_cores` skips meta cores itself, for layers made with
``device="meta"`` outside it. Meta fills draw nothing from the CPU generator, so skipping them
changes no later random draw.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["on_meta"]

# in-place random fills, as Tensor methods and as torch.nn.init functions (which dispatch
# through __torch_function__ with the tensor as a keyword argument)
RANDOM_FILLS = frozenset(
    {
        "normal_",
        "uniform_",
        "trunc_normal_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "orthogonal_",
        "sparse_",
        "bernoulli_",
        "exponential_",
        "random_",
    }
)


class _SkipRandomFills(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if (
            getattr(func, "__name__", None) in RANDOM_FILLS
            and isinstance(target, torch.Tensor)
            and target.is_meta
        ):
            return target
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules created inside are on the ``meta`` device, their random fills skipped."""
    with torch.device("meta"), _SkipRandomFills():
        yield

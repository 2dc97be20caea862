"""``ParamList``: an ``nn.ParameterList`` whose reads skip the per-entry attribute lookup.

``nn.ParameterList`` reads entry ``i`` as ``getattr(self, str(i))`` (through
``Module.__getattr__``) and iterates by indexing, so ``list(layer.cores)`` of a six-core
TT-linear takes about 14 us and ``(*cores, *gates)`` 26 us on the CI machine: a CoMERA step
reads its 37 TT-linears' cores and gates several times (the premerge session's signatures,
plans and merges), about 2-3 ms of a 75 ms batch-1 step. ``ParamList`` reads the entries
straight from the module's parameter dict, in which they sit in index order
(``append`` / ``extend`` register ``str(len(self))``, ``list[i] = p`` replaces the value under
``str(i)`` in place), so iteration and integer indexing return the same objects as the base
class, in the same order, at dict speed. Anything else (slices, an entry that is not a
registered parameter) goes through ``nn.ParameterList``. State dict keys, ``parameters()``
and ``named_parameters()`` are the base class's (``cores.0``, ``cores.1``, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["ParamList"]


class ParamList(nn.ParameterList):
    """``nn.ParameterList`` with dict-speed iteration and integer indexing (module doc)."""

    def __iter__(self) -> Iterator[Any]:
        params = self._parameters
        if len(params) == len(self):  # every entry a registered parameter, keys "0".."n-1"
            return iter(tuple(params.values()))
        return super().__iter__()

    def __getitem__(self, idx: Any) -> Any:
        if type(idx) is int:
            n = len(self)
            found = self._parameters.get(str(idx + n if -n <= idx < 0 else idx))
            if found is not None:
                return found
        return super().__getitem__(idx)

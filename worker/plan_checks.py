"""The checks a plan makes once it knows the data and the model; each failure a ``SpecError``
naming the field of the submitted spec that decides it (a 422 at submission, a ``validation``
failure in the worker).

* :func:`check_data_sizes`: the model fields the data sets (classes, features, vocabulary,
  rows per table) against the same bounds as ``model.config``
  (:mod:`api_schemas.model_limits`: each size, and the dense parameter cap), named by where
  they come from (the dataset reference, or the ``dataset`` field that decides them);
* :func:`check_modes`: explicit ``compression.modes`` may pad a layer to at most twice its
  size per side (modes (2048, 2048) on a 16 x 32 layer padded it 8,000-fold);
* :func:`check_capacity`: the memory estimate within the worker's capacity, naming the part
  that dominates it.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

from api_schemas.engine_spec import SpecError
from api_schemas.model_limits import config_errors
from worker.data_facts import DataFacts
from worker.memory_estimate import MemoryEstimate

__all__ = ["MAX_PADDING", "check_capacity", "check_data_sizes", "check_modes", "gib"]

MAX_PADDING = 2  # explicit modes: a side's product at most this many times the layer's size


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_data_sizes(arch: str, config: Mapping[str, Any], facts: DataFacts) -> None:
    """Raise for the first bound the data-derived sizes break (``config`` wins over the data,
    as the engine merges them)."""
    from_data = {k: v for k, v in facts.overrides.items() if k not in config}
    if not from_data:
        return
    for err in config_errors(arch, {**from_data, **config}):
        loc = err["loc"]
        key = str(loc[0]) if loc else None
        msg = err["type"].message()  # type: ignore[union-attr]
        if key in from_data:
            pointer, how = facts.sources.get(key, ("/dataset", "the data"))
            raise SpecError(
                pointer, f"the data gives {key} = {_show(from_data[key])} ({how}): {msg}"
            )
        if key is None:  # the dense parameter cap
            key = next(iter(k for k in facts.sources if k in from_data), next(iter(from_data)))
            pointer, how = facts.sources.get(key, ("/dataset", "the data"))
            sizes = ", ".join(f"{k} = {_show(v)}" for k, v in from_data.items())
            raise SpecError(pointer, f"with the sizes the data gives ({sizes}), {msg}")


def _show(v: Any) -> str:
    if isinstance(v, list):
        return f"[{', '.join(f'{x:,}' for x in v[:4])}{', ...' if len(v) > 4 else ''}]"
    return f"{v:,}" if isinstance(v, int) else repr(v)


def check_modes(layers: list[dict[str, Any]], patterns: tuple[tuple[str, Any, Any], ...]) -> None:
    """Explicit modes (``patterns``: the engine's ``(pattern, in, out)``) within
    ``MAX_PADDING`` times each side of every layer they shape (``layers``: the plan's)."""
    for layer in layers:
        pattern = next((p for p, _, _ in patterns if fnmatch.fnmatchcase(layer["name"], p)), None)
        if pattern is None:
            continue
        sides = list(layer["modes"].items())  # in/out, or rows/cols
        for (side, modes), size in zip(sides, layer["shape"], strict=True):
            product = math.prod(modes)
            if product > MAX_PADDING * size:
                raise SpecError(
                    f"/compression/modes/{pattern}",
                    f"layer {layer['name']!r} has {size:,} {side} features, the modes "
                    f"{list(modes)} multiply to {product:,}: at most {MAX_PADDING}x the "
                    "layer's size (the rest is padding computed on every step)",
                )


def check_capacity(
    estimate: MemoryEstimate, capacity: int, *, model_pointer: str, data_pointer: str
) -> None:
    """The estimate within ``capacity``; else named after its largest part. A data-parallel
    job's estimate is per process, and so is the capacity: what a worker offers each device."""
    if estimate.total <= capacity:
        return
    who, offer = "the job needs", "a job"
    if estimate.processes > 1:
        who, offer = f"each of the job's {estimate.processes} processes needs", "each process"
    parts = [
        (estimate.model_bytes, model_pointer, "the model's weights, gradients and Adam state"),
        (estimate.activation_bytes, "/training/batch_size", "activations"),
        (estimate.data_bytes, data_pointer, "the data held in memory"),
    ]
    _, pointer, what = max(parts, key=lambda p: p[0])
    raise SpecError(
        pointer,
        f"{who} an estimated {gib(estimate.total)} (model {gib(estimate.model_bytes)}, "
        f"activations {gib(estimate.activation_bytes)}, data {gib(estimate.data_bytes)}, "
        f"the process itself {gib(estimate.baseline_bytes + estimate.slack_bytes)}), "
        f"most of it {what}; a worker offers {offer} {gib(capacity)}",
    )

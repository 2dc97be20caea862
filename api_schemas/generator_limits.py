"""Upper bounds on ``dataset.params``, the synthetic generators' parameters, without torch.

The engine checks each generator's parameters for type and lower bounds when the data is
built, but nothing there bounded what they cost: ``n_words: 1e9`` made the NLI word list
generator run for as long as the planner let it (2-3 syllable words run out after 347,900),
and the sizes below are what each generator allocates before its first row (the MLM chain's
``n_words x n_words`` transition matrix, a Criteo table's hashes and embeddings, the MLP
cluster means). So every parameter of every generator has a finite upper bound here, and the
joint sizes a generator allocates are bounded too. The rows themselves (``n_train`` x a
row's size) are bounded by the job's memory estimate (``worker.memory_estimate``).

:func:`generator_errors` lists every violation as ``InitErrorDetails`` located at
``("dataset", "params", key[, index])``, so a 422 names ``/dataset/params/n_words``; a joint
bound is located at the parameter that drives it. Keys the engine does not know are left to
its own check (a 422 from the planner naming the key).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic_core import InitErrorDetails, PydanticCustomError

from api_schemas.model_limits import MAX_CLASSES

__all__ = [
    "GENERATOR_OF_ARCH",
    "INT_BOUNDS",
    "MAX_CRITEO_CATEGORIES",
    "MAX_CRITEO_EMBEDDING_ENTRIES",
    "MAX_MLP_FEATURES",
    "MAX_MLP_MEANS",
    "MLM_MAX_WORDS",
    "NLI_MAX_WORDS",
    "generator_errors",
    "generator_of",
]

# the generator a synthetic dataset uses when ``dataset.generator`` is not set
GENERATOR_OF_ARCH = {
    "transformer": "nli",
    "dlrm": "criteo",
    "mlm": "mlm",
    "mlp": "mlp",
    "hf_bert": "stdlib_text",
}
NLI_MAX_WORDS = 20_000  # of 347,900 distinct 2-3 syllable words (20,000: ~3 s to draw)
MLM_MAX_WORDS = 4096  # the chain is a dense (n_words, n_words) float64 matrix: 128 MiB
MAX_TEXT_LEN = 512  # words of a generated sentence (sequences are cut at dataset.max_len)
CRITEO_TABLES = 26
MAX_CRITEO_CARDINALITY = 1_000_000  # categories of one table
MAX_CRITEO_CATEGORIES = 1_000_000  # over the 26 tables (a random hash string each: ~3 s)
MAX_CRITEO_EMBEDDING_ENTRIES = 1 << 25  # (categories + 1) x rank over interaction tables
MAX_MLP_FEATURES = 1 << 20  # as model.config.in_features
MAX_MLP_MEANS = 1 << 24  # clusters x features (the cluster means, float64: 128 MiB)
MAX_SHAPE_DIMS = 8

# generator -> integer parameter -> (low, high); low repeats the engine's own lower bound
INT_BOUNDS: dict[str, dict[str, tuple[int, int]]] = {
    "nli": {
        "n_words": (20, NLI_MAX_WORDS),
        "n_topics": (1, 10_000),
        "min_premise": (2, MAX_TEXT_LEN),
        "max_premise": (2, MAX_TEXT_LEN),
        "min_hypothesis": (2, MAX_TEXT_LEN),
        "max_hypothesis": (2, MAX_TEXT_LEN),
    },
    "mlm": {
        "n_words": (10, MLM_MAX_WORDS),
        "branching": (1, 256),
        "min_len": (2, MAX_TEXT_LEN),
        "max_len": (2, MAX_TEXT_LEN),
    },
    "stdlib_text": {"min_words": (1, MAX_TEXT_LEN), "max_words": (1, MAX_TEXT_LEN)},
    "criteo": {"rank": (1, 64), "interaction_tables": (0, CRITEO_TABLES)},
    "mlp": {"num_classes": (2, MAX_CLASSES), "clusters_per_class": (1, 64)},
}


def generator_of(arch: str, generator: str | None) -> str | None:
    """The generator of a synthetic dataset for ``arch`` (None for an unknown arch)."""
    return generator or GENERATOR_OF_ARCH.get(arch)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _error(key: str | tuple[str | int, ...], value: Any, code: str, msg: str) -> InitErrorDetails:
    loc = ("dataset", "params", *((key,) if isinstance(key, str) else key))
    return InitErrorDetails(
        type=PydanticCustomError(code, "{message}", {"message": msg}), loc=loc, input=value
    )


def _int(key: str, v: Any, low: int, high: int) -> InitErrorDetails | None:
    if _is_int(v) and low <= v <= high:
        return None
    code = "int_type" if not _is_int(v) else "less_than_equal" if v > high else "greater_than_equal"
    return _error(key, v, code, f"{key} must be an integer in [{low}, {high}], got {v!r}")


def _int_list(key: str, v: Any, high: int, max_items: int) -> list[InitErrorDetails]:
    """An integer in [1, high] or a list of 1..max_items of them."""
    items = [v] if not isinstance(v, list) else v
    if not 1 <= len(items) <= max_items:
        msg = f"{key} must be an integer or a list of 1 to {max_items} integers, got {len(items)}"
        return [_error(key, v, "too_long" if items else "too_short", msg)]
    errors = []
    for i, x in enumerate(items):
        if not (_is_int(x) and 1 <= x <= high):
            where = (key, i) if isinstance(v, list) else key
            msg = f"{key} entries must be integers in [1, {high}], got {x!r}"
            errors.append(_error(where, x, "less_than_equal", msg))
    return errors


def _criteo(params: Mapping[str, Any]) -> list[InitErrorDetails]:
    card = params.get("cardinality", [3, 10, 30, 100, 300, 1000])
    errors = _int_list("cardinality", card, MAX_CRITEO_CARDINALITY, CRITEO_TABLES)
    if errors or any(e for e in _bounded("criteo", params)):
        return errors
    cycle = card if isinstance(card, list) else [card]
    tables = [cycle[t % len(cycle)] for t in range(CRITEO_TABLES)]
    if sum(tables) > MAX_CRITEO_CATEGORIES:
        msg = (
            f"the 26 tables (cardinality cycled over them) would hold {sum(tables):,} "
            f"categories; at most {MAX_CRITEO_CATEGORIES:,}"
        )
        return [_error("cardinality", card, "too_large", msg)]
    k, rank = params.get("interaction_tables", 8), params.get("rank", 4)
    entries = sum(c + 1 for c in tables[:k]) * rank
    if entries > MAX_CRITEO_EMBEDDING_ENTRIES:
        msg = (
            f"the embeddings of the {k} interaction tables would hold {entries:,} entries "
            f"((categories + 1) x rank); at most {MAX_CRITEO_EMBEDDING_ENTRIES:,}"
        )
        return [_error("rank", rank, "too_large", msg)]
    return []


def _mlp(params: Mapping[str, Any]) -> list[InitErrorDetails]:
    shape = params.get("shape", 32)
    errors = _int_list("shape", shape, MAX_MLP_FEATURES, MAX_SHAPE_DIMS)
    if errors or any(e for e in _bounded("mlp", params)):
        return errors
    features = math.prod(shape if isinstance(shape, list) else [shape])
    if features > MAX_MLP_FEATURES:
        msg = f"x would have {features:,} features per row (the product); at most "
        return [_error("shape", shape, "too_large", msg + f"{MAX_MLP_FEATURES:,}")]
    k = params.get("num_classes", 4) * params.get("clusters_per_class", 2)
    if k > MAX_CLASSES or k * features > MAX_MLP_MEANS:
        msg = (
            f"num_classes x clusters_per_class = {k:,} clusters of {features:,} features; "
            f"at most {MAX_CLASSES:,} clusters and {MAX_MLP_MEANS:,} entries of their means"
        )
        return [_error("clusters_per_class", params.get("clusters_per_class", 2), "too_large", msg)]
    return []


def _bounded(generator: str, params: Mapping[str, Any]) -> list[InitErrorDetails]:
    bounds = INT_BOUNDS.get(generator, {})
    errors = [_int(key, params[key], *bounds[key]) for key in bounds if key in params]
    return [e for e in errors if e]


MAX_PACKAGES = 16  # stdlib_text's packages (engine.data.stdlib_text.MAX_PACKAGES)
MAX_WEIGHT = 100.0  # stdlib_text's weights (engine.data.stdlib_text.MAX_WEIGHT)


def _strings(params: Mapping[str, Any]) -> list[InitErrorDetails]:
    """``stdlib_text``: ``source`` a short string, ``modules`` a pattern or a list of them,
    ``packages`` a list of at most :data:`MAX_PACKAGES` distinct package (import) names,
    ``also`` a short list of source names, ``weights`` a small map of them to numbers (the
    engine checks the names)."""
    errors = []
    source = params.get("source", "docstrings")
    if not isinstance(source, str) or len(source) > 32:
        errors.append(_error("source", source, "string_type", "source must be a short string"))
    mods = params.get("modules", ["*"])
    items = mods if isinstance(mods, list) else [mods]
    if not items or not all(isinstance(m, str) and 0 < len(m) <= 64 for m in items):
        msg = "modules must be a list of 1-64 patterns of 1-64 characters"
        errors.append(_error("modules", mods, "invalid", msg))
    pkgs = params.get("packages", [])
    if (
        not isinstance(pkgs, list)
        or len(pkgs) > MAX_PACKAGES
        or not all(isinstance(p, str) and p.isidentifier() and len(p) <= 64 for p in pkgs)
        or len(set(pkgs)) != len(pkgs)
    ):
        msg = f"packages must be a list of at most {MAX_PACKAGES} distinct package names"
        errors.append(_error("packages", pkgs, "invalid", msg))
    also = params.get("also", [])
    if not isinstance(also, list) or len(also) > 8 or not all(_short(a) for a in also):
        msg = "also must be a list of at most 8 source names"
        errors.append(_error("also", also, "invalid", msg))
    weights = params.get("weights", {})
    if (
        not isinstance(weights, dict)
        or len(weights) > 9
        or not all(_short(k) and _number(v) and 0 < v <= MAX_WEIGHT for k, v in weights.items())
    ):
        msg = f"weights must map at most 9 source names to numbers in (0, {MAX_WEIGHT:g}]"
        errors.append(_error("weights", weights, "invalid", msg))
    return errors


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _short(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 32


def generator_errors(generator: str | None, params: Mapping[str, Any]) -> list[InitErrorDetails]:
    """Every bound ``params`` of ``generator`` breaks (located at ``dataset.params``)."""
    if generator == "criteo":
        return _bounded(generator, params) + _criteo(params)
    if generator == "mlp":
        return _bounded(generator, params) + _mlp(params)
    if generator == "stdlib_text":
        return _bounded(generator, params) + _strings(params)
    return _bounded(generator or "", params)

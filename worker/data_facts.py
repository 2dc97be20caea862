"""What a job's data decides about its model, and what holding it costs, read without training.

:func:`data_facts` returns the model fields the data sets (``in_features`` and ``num_classes``
of NPZ arrays, ``num_classes`` of sentence-pair labels, the vocabulary, Criteo table rows),
where each comes from (a JSON Pointer into the submitted spec: the dataset reference, or the
``dataset`` field that decides it), the training batches per epoch when known, and the bytes
the worker holds for the data (:mod:`worker.memory_estimate` adds them to the model's).

Files are read from their headers and metadata, not their rows: NPZ ``.npy`` headers and one
streamed pass over the labels ``y`` (``max(y) + 1`` classes), Criteo table rows from
``dataset.num_rows``, the vocabulary's upper bound from ``dataset.vocab_size`` (the tokenizer
is trained up to it). Sentence-pair labels need a pass over the file: made when the file is at
most ``LABEL_SCAN_BYTES`` (a warning otherwise: the worker's loader counts them). Generated
data is sampled (at most ``SAMPLE_ROWS`` rows) except the MLP generator's, whose sizes are its
parameters. Runs in the planner's child (at submission) and in the worker before training.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from api_schemas.engine_spec import SpecError
from api_schemas.generator_limits import generator_of
from engine.data import build_data
from engine.data.arrays import label_range, npz_bytes_in_memory, npz_headers
from engine.data.config import DataConfig
from engine.data.criteo import dlrm_overrides
from engine.data.source import split_counts
from engine.data.stdlib_text import check_packages
from engine.data.synthetic import parse_params
from engine.data.synthetic_tabular import BLOCK
from engine.data.text import read_pairs
from engine.train.config import as_config_error
from engine.train.job import JobConfig

__all__ = ["LABEL_SCAN_BYTES", "SAMPLE_ROWS", "DataFacts", "data_facts"]

SAMPLE_ROWS = 2048
LABEL_SCAN_BYTES = 64 << 20
MAX_LABELS = 1 << 20  # a label pass stops here (the model bound is lower: a 422 anyway)
TOKEN_BYTES = 24  # a token id held in Python lists (pointer, list growth) plus its share
ROW_BYTES = 400  # a row's tuple, lists and strings around its tokens or values


@dataclass
class DataFacts:
    overrides: dict[str, Any] = field(default_factory=dict)  # model fields from the data
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)  # field: (pointer, how)
    per_epoch: int | None = None
    data_bytes: int = 0
    warnings: list[str] = field(default_factory=list)


def _per_epoch(rows: int, batch: int, drop_last: bool) -> int:
    return rows // batch if drop_last else math.ceil(rows / batch)


def _npz(data: DataConfig, pointer: str, batch: int) -> DataFacts:
    assert data.train is not None
    hx, _ = npz_headers(data.train)
    top = label_range(data.train)[1]
    if data.valid is not None:
        top = max(top, label_range(data.valid)[1])
    classes, rows = top + 1, hx.shape[0]
    if data.valid is None and data.valid_every:
        rows = split_counts(rows, data.valid_every)[0]
    row = hx.features * 4 + ROW_BYTES  # float32 features
    held = min(data.shuffle_buffer or 1, hx.shape[0]) * row
    held += npz_bytes_in_memory(data.train)  # a compressed Fortran-ordered x, read whole
    how = "max label + 1 of y"
    return DataFacts(
        overrides={"in_features": hx.features, "num_classes": classes},
        sources={"in_features": (pointer, "features per row of x"), "num_classes": (pointer, how)},
        per_epoch=_per_epoch(rows, batch, data.drop_last),
        data_bytes=held,
    )


def _pair_labels(data: DataConfig, pointer: str) -> DataFacts:
    """Sentence pairs: vocabulary up to ``vocab_size``; classes from ``labels`` or a pass."""
    assert data.train is not None
    facts = DataFacts(
        overrides={"vocab_size": data.vocab_size},
        sources={"vocab_size": ("/dataset/vocab_size", "the tokenizer's vocabulary")},
        data_bytes=data.shuffle_buffer * (ROW_BYTES + TOKEN_BYTES * data.max_len),
    )
    if data.labels is not None:
        facts.overrides["num_classes"] = len(data.labels)
    elif os.path.getsize(data.train) <= LABEL_SCAN_BYTES:
        seen: set[str] = set()
        for _line, _a, _b, label in read_pairs(data.train, data.kind, data):
            seen.add(label)
            if len(seen) > MAX_LABELS:
                break
        facts.overrides["num_classes"] = len(seen)
        facts.sources["num_classes"] = (pointer, "distinct labels")
    else:
        facts.warnings.append(
            f"the labels of files over {LABEL_SCAN_BYTES >> 20} MiB are counted by the worker"
        )
    return facts


def _synthetic_mlp(data: DataConfig, batch: int) -> DataFacts:
    """The MLP generator's sizes are its parameters; its rows are generated as float64
    blocks of ``BLOCK`` rows, concatenated, compared with every cluster mean, then cast."""
    p = parse_params("mlp", data.params)
    features, clusters = math.prod(p.shape), p.num_classes * p.clusters_per_class
    n = data.n_train + data.n_valid
    blocks = math.ceil(n / BLOCK) * BLOCK
    held = 8 * blocks * features + 12 * n * features + 24 * n * clusters + ROW_BYTES * n
    return DataFacts(
        overrides={"in_features": features, "num_classes": p.num_classes},
        sources={
            "in_features": ("/dataset/params/shape", "features of the generated x"),
            "num_classes": ("/dataset/params/num_classes", "classes of the generated y"),
        },
        per_epoch=_per_epoch(data.n_train, batch, data.drop_last),
        data_bytes=held,
    )


def _without_packages(data: DataConfig, arch: str) -> DataConfig:
    """``stdlib_text`` with ``packages``: they are checked (installed, within the file bound)
    and left out of the sample. Parsing them takes tens of seconds (torch: 2,282 files) and
    the sample needs a few sentences, which the standard library alone gives."""
    if generator_of(arch, data.generator) != "stdlib_text":
        return data
    packages = parse_params("stdlib_text", data.params).packages
    if not packages:
        return data
    check_packages(packages)
    return data.replace(params={k: v for k, v in data.params.items() if k != "packages"})


def _synthetic(cfg: JobConfig, batch: int) -> DataFacts:
    """Model fields from a sample of the generated data; every row is held in memory."""
    data, arch = cfg.data, cfg.model.arch
    sample = data.replace(
        n_train=min(data.n_train, SAMPLE_ROWS), n_valid=min(data.n_valid, SAMPLE_ROWS // 8)
    )
    try:
        sample = _without_packages(sample, arch)
        with tempfile.TemporaryDirectory(prefix="comera-plan-") as tmp:
            bundle = build_data(
                sample,
                arch=arch,
                batch_size=batch,
                seed=cfg.training.seed,
                workdir=tmp,
                model_config=cfg.model.config,
            )
    except ValueError as err:
        raise as_config_error(err, "data") from None
    facts = DataFacts(overrides=dict(bundle.model_overrides))
    for key, pointer in (
        ("vocab_size", "/dataset/vocab_size"),
        ("table_sizes", "/dataset/num_rows"),
    ):
        if key in facts.overrides:
            facts.sources[key] = (pointer, "the generated data")
    if data.n_train > SAMPLE_ROWS:
        facts.warnings.append(
            f"model fields derived from the data come from a sample of {SAMPLE_ROWS} generated rows"
        )
    if arch != "mlm":  # masked-LM packs lines into sequences: unknown without a full pass
        facts.per_epoch = _per_epoch(data.n_train, batch, data.drop_last)
    tokens = {"dlrm": 40}.get(arch, data.max_len)  # Criteo: 13 counts and 26 categories
    facts.data_bytes = (data.n_train + data.n_valid) * (ROW_BYTES + TOKEN_BYTES * tokens)
    return facts


def data_facts(cfg: JobConfig, *, dataset_pointer: str = "/dataset/path") -> DataFacts:
    """The facts of ``cfg.data`` (module doc); ``dataset_pointer`` names the dataset reference
    of the submitted spec (``/dataset/dataset_id`` for an upload). Unreadable files raise the
    engine's ``DataError``; a file that is missing, ``SpecError`` naming the reference."""
    data, batch = cfg.data, cfg.training.batch_size
    for path in (data.train, data.valid):
        if path is not None and not os.path.isfile(path):
            raise SpecError(dataset_pointer, "the dataset's file is missing")
    if data.kind == "synthetic":
        if generator_of(cfg.model.arch, data.generator) == "mlp":
            return _synthetic_mlp(data, batch)
        return _synthetic(cfg, batch)
    if data.kind == "npz":
        return _npz(data, dataset_pointer, batch)
    if data.kind == "criteo":
        rows = data.table_rows()
        return DataFacts(
            overrides=dlrm_overrides(rows),
            sources={"table_sizes": ("/dataset/num_rows", "dataset.num_rows + 1 per table")},
            data_bytes=data.shuffle_buffer * (ROW_BYTES + TOKEN_BYTES * 40),
        )
    if data.kind in ("jsonl", "csv") and cfg.model.arch == "transformer":
        return _pair_labels(data, dataset_pointer)
    size = os.path.getsize(data.train) if data.train else 0  # text: the tokenizer's word counts
    return DataFacts(
        overrides={"vocab_size": data.vocab_size} if cfg.model.arch == "mlm" else {},
        sources={"vocab_size": ("/dataset/vocab_size", "the tokenizer's vocabulary")},
        data_bytes=size + data.shuffle_buffer * (ROW_BYTES + TOKEN_BYTES * data.max_len),
    )

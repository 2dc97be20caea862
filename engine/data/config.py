"""What data to train on: one frozen, validated config for every kind of input.

``kind`` picks the loader: ``"jsonl"`` / ``"csv"`` (sentence(-pair) classification),
``"criteo"`` (click logs, Criteo TSV), ``"text"`` (one sentence per line, masked-LM),
``"npz"`` (arrays ``x``, ``y``) or ``"synthetic"`` (in-memory generator with known structure, or
for ``hf_bert`` the ``stdlib_text`` sentences of :mod:`engine.data.stdlib_text`).
Only the fields of the chosen kind matter; the others keep their defaults.

Validation split: ``valid`` names an explicit file; otherwise ``valid_every = k >= 2`` sends
every k-th row of the training stream (0-based row index ``i`` with ``i % k == k - 1``) to
validation and the rest to training, deterministically and without reading the file twice into
memory; ``valid_every = 0`` (default) means no validation set. For the masked-LM kind the
"rows" of the split are the packed sequences.

Errors name the field as ``data.<field>``, e.g. ``data.max_len must be an integer >= 8, got 3``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["DataConfig", "KINDS", "FILE_KINDS", "GENERATORS", "N_CATEGORICAL", "params_from_dict",
           "check_int", "check_real"]  # fmt: skip

CONFIG_VERSION = 1
FILE_KINDS = ("jsonl", "csv", "criteo", "text", "npz")
KINDS = ("synthetic", *FILE_KINDS)
GENERATORS = ("nli", "criteo", "mlm", "mlp", "stdlib_text")
MAX_LENGTH_BUCKETS = 1024  # batches per length-sorted window
N_CATEGORICAL = 26  # Criteo: 26 hashed categorical features (and 13 integer ones)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_int(name: str, v: Any, lo: int) -> None:
    if not _is_int(v) or v < lo:
        raise ValueError(f"data.{name} must be an integer >= {lo}, got {v!r}")


check_int = _check_int


def check_real(name: str, v: Any, lo: float, hi: float, *, open_lo: bool = False) -> None:
    """``lo <= v <= hi`` (``lo < v`` with ``open_lo``), naming the field ``data.<name>``."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and (
        (v > lo if open_lo else v >= lo) and v <= hi
    )
    if not ok:
        lo_s = f"({lo}" if open_lo else f"[{lo}"
        raise ValueError(f"data.{name} must be a number in {lo_s}, {hi}], got {v!r}")


def params_from_dict(cls: type, data: Mapping[str, Any], generator: str) -> Any:
    """A generator's parameter dataclass from ``data.params``; unknown keys are rejected."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"data.params: unknown keys {unknown} for generator {generator!r}; "
                         f"known: {sorted(names)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _check_bool(name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"data.{name} must be true or false, got {v!r}")


def _check_name(name: str, v: Any) -> None:
    if not isinstance(v, str) or not v:
        raise ValueError(f"data.{name} must be a non-empty string, got {v!r}")


@dataclass(frozen=True)
class DataConfig:
    """Input data of a training job (see the module docstring for the split rule)."""

    kind: str = "synthetic"
    train: str | None = None  # path of the training file (file kinds)
    valid: str | None = None  # path of an explicit validation file
    valid_every: int = 0  # 0: no split; k >= 2: every k-th training row is validation
    shuffle_buffer: int = 10_000  # rows held for shuffling; 0 = file order
    drop_last: bool = False  # drop the last partial batch of an epoch
    length_buckets: int = 0  # k >= 2: sort windows of k training batches by length (0: off)
    # sentence(-pair) classification: JSONL keys / CSV header names
    text_a: str = "premise"
    text_b: str | None = "hypothesis"  # None: single-sentence classification
    label_field: str = "label"
    labels: tuple[str, ...] | None = None  # class names in id order; None: sorted, inferred
    tokenizer: str | None = None  # tokenizer.json to load; None: train a WordPiece one
    vocab_size: int = 8000  # WordPiece vocabulary size when training
    max_len: int = 128  # tokens per sequence, [CLS] and [SEP]s included
    lowercase: bool = True  # normalizer of a trained tokenizer
    pad_to_max_len: bool = False  # static shapes: pad every batch to max_len
    # Criteo click logs: hash buckets per categorical table (one int for all 26)
    num_rows: int | tuple[int, ...] = 100_000
    # masked-LM
    mlm_probability: float = 0.15
    mlm_pack: bool = True  # pack consecutive lines into max_len sequences (else: truncate)
    # synthetic data
    generator: str | None = None  # None: the generator of the architecture
    n_train: int = 10_000
    n_valid: int = 1_000
    synthetic_seed: int = 0  # seed of the generated data set (not of the training run)
    params: dict[str, Any] = field(default_factory=dict)  # generator parameters
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"data.version must be {CONFIG_VERSION}, got {self.version!r}")
        if self.kind not in KINDS:
            raise ValueError(f"data.kind must be one of {list(KINDS)}, got {self.kind!r}")
        for name in ("train", "valid", "tokenizer"):
            v = getattr(self, name)
            if isinstance(v, os.PathLike):
                v = os.fspath(v)
                object.__setattr__(self, name, v)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"data.{name} must be a file path or null, got {v!r}")
        if self.kind == "synthetic":
            for name in ("train", "valid"):
                if getattr(self, name) is not None:
                    raise ValueError(f"data.{name} must be null for kind 'synthetic' "
                                     "(write the files and use their kind instead)")
        elif self.train is None:
            raise ValueError(f"data.train is required for kind {self.kind!r}")
        _check_int("valid_every", self.valid_every, 0)
        if self.kind == "synthetic" and self.valid_every:
            raise ValueError("data.valid_every must be 0 for kind 'synthetic' (use data.n_valid)")
        if self.valid_every == 1:
            raise ValueError("data.valid_every must be 0 (no split) or >= 2, got 1")
        if self.valid_every and self.valid is not None:
            raise ValueError("data.valid_every must be 0 when data.valid is given")
        _check_int("shuffle_buffer", self.shuffle_buffer, 0)
        _check_int("length_buckets", self.length_buckets, 0)
        if self.length_buckets > MAX_LENGTH_BUCKETS:
            raise ValueError(f"data.length_buckets must be <= {MAX_LENGTH_BUCKETS}, "
                             f"got {self.length_buckets}")  # fmt: skip
        if self.length_buckets > 1 and (self.kind in ("criteo", "npz")
                                        or self.generator in ("criteo", "mlp")):  # fmt: skip
            raise ValueError("data.length_buckets: only sentence and text data can be bucketed "
                             "by length; use 0")  # fmt: skip
        for name in ("drop_last", "lowercase", "pad_to_max_len", "mlm_pack"):
            _check_bool(name, getattr(self, name))
        _check_name("text_a", self.text_a)
        if self.text_b is not None:
            _check_name("text_b", self.text_b)
        _check_name("label_field", self.label_field)
        self._check_labels()
        _check_int("vocab_size", self.vocab_size, 32)
        _check_int("max_len", self.max_len, 8)
        self._check_num_rows()
        p = self.mlm_probability
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p < 1:
            raise ValueError(f"data.mlm_probability must be in (0, 1), got {p!r}")
        if self.generator is not None and self.generator not in GENERATORS:
            raise ValueError(f"data.generator must be one of {list(GENERATORS)} or null, "
                             f"got {self.generator!r}")
        _check_int("n_train", self.n_train, 1)
        _check_int("n_valid", self.n_valid, 0)
        _check_int("synthetic_seed", self.synthetic_seed, 0)
        if not isinstance(self.params, Mapping) or not all(isinstance(k, str) for k in self.params):
            raise ValueError(f"data.params must be a mapping with string keys, got {self.params!r}")
        object.__setattr__(self, "params", dict(self.params))

    def _check_labels(self) -> None:
        labels = self.labels
        if labels is None:
            return
        if isinstance(labels, str | bytes) or not isinstance(labels, list | tuple) or not labels:
            raise ValueError(f"data.labels must be a non-empty list of class names, got {labels!r}")
        names = []
        for v in labels:
            if not (isinstance(v, str) and v) and not _is_int(v):
                raise ValueError(f"data.labels entries must be non-empty strings or integers, "
                                 f"got {v!r}")
            names.append(str(v))
        if len(set(names)) != len(names):
            raise ValueError(f"data.labels must be distinct, got {names}")
        object.__setattr__(self, "labels", tuple(names))

    def _check_num_rows(self) -> None:
        v = self.num_rows
        if _is_int(v):
            _check_int("num_rows", v, 1)
            return
        if not isinstance(v, list | tuple) or len(v) != N_CATEGORICAL or not all(
            _is_int(n) and n >= 1 for n in v
        ):
            raise ValueError(f"data.num_rows must be an integer >= 1 or a list of "
                             f"{N_CATEGORICAL} integers >= 1, got {v!r}")
        object.__setattr__(self, "num_rows", tuple(int(n) for n in v))

    def table_rows(self) -> tuple[int, ...]:
        """Hash buckets of each of the 26 categorical tables."""
        v = self.num_rows
        return tuple(v) if isinstance(v, tuple) else (int(v),) * N_CATEGORICAL

    def replace(self, **changes: Any) -> DataConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("labels", "num_rows"):
            if isinstance(out[name], tuple):
                out[name] = list(out[name])
        out["params"] = dict(self.params)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataConfig:
        """Inverse of :meth:`to_dict`; unknown keys are rejected, ``version`` defaults to 1."""
        if not isinstance(data, Mapping):
            raise ValueError(f"data must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"data: unknown keys {unknown}")
        return cls(**data)

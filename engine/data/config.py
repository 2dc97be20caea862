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

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from engine.configs import ConfigError, ConfigMethods, parse, spec, validate

__all__ = [
    "DataConfig",
    "KINDS",
    "FILE_KINDS",
    "GENERATORS",
    "N_CATEGORICAL",
    "params_from_dict",
    "check_int",
    "check_real",
]

CONFIG_VERSION = 1
FILE_KINDS = ("jsonl", "csv", "criteo", "text", "npz")
KINDS = ("synthetic", *FILE_KINDS)
GENERATORS = ("nli", "criteo", "mlm", "mlp", "stdlib_text")
MAX_LENGTH_BUCKETS = 1024  # batches per length-sorted window
N_CATEGORICAL = 26  # Criteo: 26 hashed categorical features (and 13 integer ones)
MAX_PATH = 4096
MAX_NAME = 64  # JSONL keys / CSV header names
MAX_VOCAB = 250_000
MAX_LEN = 2048
MAX_TABLE_ROWS = 50_000_000
MAX_ROWS = 10_000_000  # generated training rows
MAX_VALID_ROWS = 1_000_000
MAX_SEED = 2**31 - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(name: str, v: Any, lo: int) -> None:
    """``v`` an integer ``>= lo``, naming the field ``data.<name>`` (generator parameters)."""
    if not _is_int(v) or v < lo:
        raise ConfigError(f"data.{name}", f"must be an integer >= {lo}, got {v!r}")


def check_real(name: str, v: Any, lo: float, hi: float, *, open_lo: bool = False) -> None:
    """``lo <= v <= hi`` (``lo < v`` with ``open_lo``), naming the field ``data.<name>``."""
    ok = (
        isinstance(v, numbers.Real)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and ((v > lo if open_lo else v >= lo) and v <= hi)
    )
    if not ok:
        lo_s = f"({lo}" if open_lo else f"[{lo}"
        raise ConfigError(f"data.{name}", f"must be a number in {lo_s}, {hi}], got {v!r}")


def params_from_dict(cls: type, data: Mapping[str, Any], generator: str) -> Any:
    """A generator's parameter dataclass from ``data.params``; unknown keys are rejected."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"data.params.{unknown[0]}",
            f"unknown parameter of generator {generator!r} (all unknown: {unknown}; "
            f"known: {sorted(names)})",
        )
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _path(value: Any) -> Any:
    """A path field: ``os.PathLike`` read as its string."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _num_rows(value: Any) -> Any:
    """One bucket count for every table, or a list of one per table (checked as such)."""
    if isinstance(value, list | tuple):
        if len(value) != N_CATEGORICAL or not all(_is_int(n) for n in value):
            raise ConfigError(
                "", f"must be an integer or a list of {N_CATEGORICAL} integers, got {value!r}"
            )
        for n in value:
            if not 1 <= n <= MAX_TABLE_ROWS:
                raise ConfigError("", f"every entry must be in [1, {MAX_TABLE_ROWS}], got {n}")
        return tuple(int(n) for n in value)
    if not _is_int(value) or not 1 <= value <= MAX_TABLE_ROWS:
        raise ConfigError(
            "",
            f"must be an integer in [1, {MAX_TABLE_ROWS}] or a list of {N_CATEGORICAL} such "
            f"integers, got {value!r}",
        )
    return value


def _labels(value: Any) -> Any:
    """Class names in id order: strings or integers, read as strings, distinct."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple) or not value:
        raise ConfigError("", f"must be a non-empty list of class names, got {value!r}")
    names = []
    for v in value:
        if not (isinstance(v, str) and v) and not _is_int(v):
            raise ConfigError("", f"entries must be non-empty strings or integers, got {v!r}")
        names.append(str(v))
    if len(set(names)) != len(names):
        raise ConfigError("", f"must be distinct, got {names}")
    return tuple(names)


@dataclass(frozen=True)
class DataConfig(ConfigMethods):
    """Input data of a training job (see the module docstring for the split rule)."""

    kind: str = spec("synthetic", choices=KINDS)
    train: str | None = spec(None, length=(1, MAX_PATH), convert=_path)  # file kinds
    valid: str | None = spec(None, length=(1, MAX_PATH), convert=_path)  # explicit split
    valid_every: int = spec(0, ge=0, le=1000)  # 0: no split; k >= 2: every k-th row
    shuffle_buffer: int = spec(10_000, ge=0, le=10_000_000)  # rows held; 0 = file order
    drop_last: bool = False  # drop the last partial batch of an epoch
    # k >= 2: sort windows of k training batches by length (0: off)
    length_buckets: int = spec(0, ge=0, le=MAX_LENGTH_BUCKETS)
    # sentence(-pair) classification: JSONL keys / CSV header names
    text_a: str = spec("premise", length=(1, MAX_NAME))
    text_b: str | None = spec("hypothesis", length=(1, MAX_NAME))  # None: one sentence
    label_field: str = spec("label", length=(1, MAX_NAME))
    # class names in id order; None: sorted, inferred
    labels: tuple[str, ...] | None = spec(None, convert=_labels)
    tokenizer: str | None = spec(None, length=(1, MAX_PATH), convert=_path)  # None: train one
    vocab_size: int = spec(8000, ge=64, le=MAX_VOCAB)  # WordPiece vocabulary when training
    max_len: int = spec(128, ge=8, le=MAX_LEN)  # tokens per sequence, [CLS]/[SEP] included
    lowercase: bool = True  # normalizer of a trained tokenizer
    pad_to_max_len: bool = False  # static shapes: pad every batch to max_len
    # Criteo click logs: hash buckets per categorical table (one int for all 26)
    num_rows: int | tuple[int, ...] = spec(100_000, ge=1, le=MAX_TABLE_ROWS, convert=_num_rows)
    # masked-LM
    mlm_probability: float = spec(0.15, gt=0, lt=1)
    mlm_pack: bool = True  # pack consecutive lines into max_len sequences (else: truncate)
    # synthetic data
    generator: str | None = spec(None, choices=GENERATORS)  # None: the architecture's
    n_train: int = spec(10_000, ge=1, le=MAX_ROWS)
    n_valid: int = spec(1_000, ge=0, le=MAX_VALID_ROWS)
    synthetic_seed: int = spec(0, ge=0, le=MAX_SEED)  # of the data set, not of the run
    params: dict[str, Any] = field(default_factory=dict)  # generator parameters
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)
        if not all(isinstance(k, str) for k in self.params):
            raise ConfigError("params", f"must have string keys, got {self.params!r}")
        if self.kind == "synthetic":
            for name in ("train", "valid"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        name,
                        "must be null for kind 'synthetic' (write the files and use their "
                        "kind instead)",
                    )
        elif self.train is None:
            raise ConfigError("train", f"is required for kind {self.kind!r}")
        if self.kind == "synthetic" and self.valid_every:
            raise ConfigError("valid_every", "must be 0 for kind 'synthetic' (use data.n_valid)")
        if self.valid_every == 1:
            raise ConfigError("valid_every", "must be 0 (no split) or >= 2, got 1")
        if self.valid_every and self.valid is not None:
            raise ConfigError("valid_every", "must be 0 when data.valid is given")
        if self.length_buckets > 1 and (
            self.kind in ("criteo", "npz") or self.generator in ("criteo", "mlp")
        ):
            raise ConfigError(
                "length_buckets", "only sentence and text data can be bucketed by length; use 0"
            )

    def table_rows(self) -> tuple[int, ...]:
        """Hash buckets of each of the 26 categorical tables."""
        v = self.num_rows
        return tuple(v) if isinstance(v, tuple) else (int(v),) * N_CATEGORICAL

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "data") -> DataConfig:
        """Inverse of :meth:`to_dict`; unknown keys are rejected, ``version`` defaults to 1;
        errors name ``data.<field>``."""
        return parse(cls, data, path)

"""Synthetic data for every workload: in memory (``kind="synthetic"``) or written as files.

One generator per architecture (``data.generator``, default the architecture's own), each
registered by :func:`register_generator` on its in-memory builder, with its file writer:

    nli     transformer   sentence pairs, label = relation of hypothesis to premise
    criteo  dlrm          Criteo-format clicks from a logistic model over hidden effects
    mlm     mlm           Markov-chain sentences (masked words predictable from neighbours)
    mlp     mlp           Gaussian clusters
    stdlib_text  hf_bert  English sentences from the standard library's docstrings

(structure and oracle figures: :mod:`engine.data.synthetic_text`,
:mod:`engine.data.synthetic_tabular`). The data set is a pure function of
``(synthetic_seed, params)``: training rows are the first ``n_train`` rows, validation the next
``n_valid``. In memory the rows go through the same parse / tokenize / collate code as the file
loaders (Criteo lines are parsed by the Criteo parser), so
``write_synthetic`` + the file kind gives the same examples as ``kind="synthetic"``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.configs import ConfigError
from engine.data.arrays import build_array_data
from engine.data.config import DataConfig, params_from_dict
from engine.data.criteo import collate_criteo, dlrm_overrides, parse_criteo
from engine.data.lines import build_mlm_data
from engine.data.sentences import build_sentence_data
from engine.data.source import DataBundle, train_valid_sources
from engine.data.stdlib_text import StdlibTextParams
from engine.data.synthetic_tabular import (
    CriteoParams,
    MLPParams,
    criteo_lines,
    generate_criteo,
    generate_mlp,
)
from engine.data.synthetic_text import MLMParams, NLIParams, generate_mlm, generate_nli
from engine.data.text import build_pair_data
from engine.data.text_draw import generate_stdlib_text, generate_tagged_text

__all__ = [
    "GENERATOR_OF_ARCH",
    "GENERATORS",
    "PARAMS",
    "Generator",
    "Request",
    "SyntheticFiles",
    "get_generator",
    "register_generator",
    "parse_params",
    "build_synthetic_data",
    "write_synthetic",
]

SUFFIX = {"jsonl": ".jsonl", "csv": ".csv", "criteo": ".tsv", "text": ".txt", "npz": ".npz"}
# the generator of an architecture without one of its own (``hf``: sentences)
DEFAULT_GENERATOR = "stdlib_text"


@dataclass(frozen=True)
class Request:
    """What an in-memory generator gets: the data config, its parsed ``data.params``, the
    origins reported in errors and the loader settings."""

    cfg: DataConfig
    params: Any
    names: tuple[str, str]
    workdir: str | Path | None
    tokenizer: str | None
    batch_size: int
    seed: int

    @property
    def n(self) -> int:
        """Rows to generate: training then validation."""
        return self.cfg.n_train + self.cfg.n_valid

    @property
    def common(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "seed": self.seed}

    @property
    def text(self) -> dict[str, Any]:
        """The keywords of the tokenizing builders (pairs, MLM lines) for rows in memory."""
        return {"workdir": self.workdir, "names": self.names, "in_memory": True, **self.common}

    def split(self, rows: list[Any]) -> tuple[Callable[[], list[Any]], Callable | None]:
        """Row sources: the first ``n_train`` rows train, the rest (if any) validate."""
        tr, va = rows[: self.cfg.n_train], rows[self.cfg.n_train :]
        return (lambda: tr), ((lambda: va) if va else None)


# build(request) -> (bundle, info); write(paths, params, n_train, n, seed, kind) -> info
Build = Callable[[Request], tuple[DataBundle, dict[str, Any]]]
Write = Callable[[list[Path], Any, int, int, int, str], dict[str, Any]]


@dataclass(frozen=True)
class Generator:
    """A registered synthetic generator: what it is for and its two outputs."""

    name: str
    arch: str  # the architecture it makes data for (and is the default generator of)
    params: type  # the dataclass of its ``data.params``
    formats: tuple[str, ...]  # the file kinds :func:`write_synthetic` writes, default first
    build: Build  # in memory (``kind="synthetic"``)
    write: Write  # to files of ``formats``
    also_for: tuple[str, ...] = ()  # other architectures it feeds


GENERATORS: dict[str, Generator] = {}


def register_generator(
    name: str,
    *,
    arch: str,
    params: type,
    formats: tuple[str, ...],
    write: Write,
    also_for: tuple[str, ...] = (),
) -> Callable[[Build], Build]:
    """Register the decorated in-memory builder as generator ``name`` (the shape of torchao's
    ``register_quantize_module_handler``); ``write`` writes the same rows as files."""

    def register(build: Build) -> Build:
        if name in GENERATORS:
            raise ValueError(f"generator {name!r} is already registered")
        GENERATORS[name] = Generator(name, arch, params, formats, build, write, also_for)
        return build

    return register


def get_generator(name: str) -> Generator:
    """The generator called ``name``; an unknown name is a ConfigError on ``data.generator``
    listing the registered ones."""
    try:
        return GENERATORS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            "data.generator", f"must be one of {sorted(GENERATORS)}, got {name!r}"
        ) from None


def parse_params(generator: str, params: Mapping[str, Any] | None) -> Any:
    """The validated parameter dataclass of ``generator`` (errors name ``data.params.<x>``)."""
    return params_from_dict(get_generator(generator).params, dict(params or {}), generator)


def _numbered(rows: list[Any]) -> list[tuple[int, Any]]:
    return [(i + 1, r) for i, r in enumerate(rows)]


# -- the generators: files first (the writers), then the in-memory builders --------------------
def _write_nli(paths: list[Path], p: Any, n_train: int, n: int, seed: int, kind: str) -> dict:
    rows, info = generate_nli(n, seed, p)
    for path, part in zip(paths, (rows[:n_train], rows[n_train:]), strict=True):
        with open(path, "w", newline="", encoding="utf-8") as f:
            if kind == "csv":
                w = csv.writer(f)
                w.writerow(["premise", "hypothesis", "label"])
                w.writerows(part)
            else:
                f.writelines(
                    json.dumps({"premise": a, "hypothesis": b, "label": y}) + "\n"
                    for a, b, y in part
                )
    return info


def _lines_writer(make: Callable[[int, int, Any], tuple[list[str], dict]]) -> Write:
    def write(paths: list[Path], p: Any, n_train: int, n: int, seed: int, kind: str) -> dict:
        lines, info = make(n, seed, p)
        for path, part in zip(paths, (lines[:n_train], lines[n_train:]), strict=True):
            path.write_text("".join(s + "\n" for s in part), encoding="utf-8")
        return info

    return write


def _write_criteo(paths: list[Path], p: Any, n_train: int, n: int, seed: int, kind: str) -> dict:
    """Block by block: memory stays bounded."""
    blocks, info = criteo_lines(n, seed, p)
    with open(paths[0], "wb") as ft, open(paths[1], "wb") as fv:
        written = 0
        for block in blocks:
            cut = max(0, min(len(block), n_train - written))
            ft.writelines(block[:cut])
            fv.writelines(block[cut:])
            written += len(block)
    return info


def _write_mlp(paths: list[Path], p: Any, n_train: int, n: int, seed: int, kind: str) -> dict:
    x, y, info = generate_mlp(n, seed, p)
    for path, sl in zip(paths, (slice(0, n_train), slice(n_train, n)), strict=True):
        with open(path, "wb") as f:
            np.savez(f, x=x[sl], y=y[sl])
    return info


@register_generator(
    "nli",
    arch="transformer",
    params=NLIParams,
    formats=("jsonl", "csv"),
    write=_write_nli,
    also_for=("hf",),
)
def _nli(r: Request) -> tuple[DataBundle, dict[str, Any]]:
    rows, info = generate_nli(r.n, r.cfg.synthetic_seed, r.params)
    train, valid = r.split([(i + 1, a, b, y) for i, (a, b, y) in enumerate(rows)])
    bundle = build_pair_data(r.cfg, train_rows=train, valid_rows=valid, **r.text)
    return bundle, info


@register_generator(
    "criteo", arch="dlrm", params=CriteoParams, formats=("criteo",), write=_write_criteo
)
def _criteo(r: Request) -> tuple[DataBundle, dict[str, Any]]:
    """Rows as Criteo lines, through the Criteo parser."""
    cfg, nt = r.cfg, r.cfg.n_train
    raw, info = generate_criteo(r.n, cfg.synthetic_seed, r.params)
    rows_per_table = cfg.table_rows()
    parsed = list(parse_criteo(enumerate(raw, 1), rows_per_table, r.names[0]))
    train, valid = r.split(parsed)
    train_src, valid_src = train_valid_sources(
        train,
        valid,
        collate=lambda ex, _seed: collate_criteo(ex),
        shuffle_buffer=nt if cfg.shuffle_buffer else 0,
        drop_last=cfg.drop_last,
        valid_every=0,
        counts=(nt, len(parsed[nt:]) or None),
        length_buckets=cfg.length_buckets,
        **r.common,
    )
    bundle = DataBundle(
        train_src,
        valid_src,
        dlrm_overrides(rows_per_table),
        {},
        {"num_rows": list(rows_per_table)},
    )
    return bundle, info


@register_generator(
    "mlm", arch="mlm", params=MLMParams, formats=("text",), write=_lines_writer(generate_mlm)
)
def _mlm(r: Request) -> tuple[DataBundle, dict[str, Any]]:
    lines, info = generate_mlm(r.n, r.cfg.synthetic_seed, r.params)
    train, valid = r.split(_numbered(lines))
    bundle = build_mlm_data(r.cfg, train_lines=train, valid_lines=valid, **r.text)
    return bundle, info


@register_generator("mlp", arch="mlp", params=MLPParams, formats=("npz",), write=_write_mlp)
def _mlp(r: Request) -> tuple[DataBundle, dict[str, Any]]:
    x, y, info = generate_mlp(r.n, r.cfg.synthetic_seed, r.params)
    flat = x.reshape(r.n, -1)
    train, valid = r.split([(flat[i], int(y[i])) for i in range(r.n)])
    bundle = build_array_data(
        r.cfg,
        train=train,
        valid=valid,
        counts=(r.cfg.n_train, r.cfg.n_valid or None),
        in_features=flat.shape[1],
        num_classes=r.params.num_classes,
        in_memory=True,
        **r.common,
    )
    return bundle, info


@register_generator(
    "stdlib_text",
    arch="hf_bert",
    params=StdlibTextParams,
    formats=("text",),
    write=_lines_writer(generate_stdlib_text),
    also_for=("hf",),
)
def _stdlib_text(r: Request) -> tuple[DataBundle, dict[str, Any]]:
    """Sentences tokenized with the model's tokenizer (``r.tokenizer``)."""
    if r.tokenizer is None:
        raise ConfigError("data.tokenizer", "the stdlib_text generator needs a tokenizer.json")
    sentences, tags, info = generate_tagged_text(r.n, r.cfg.synthetic_seed, r.params)
    rows = _numbered(sentences)
    train, valid = r.split(rows)
    parts: dict[str, list[tuple[int, str]]] = {}
    if r.params.also:  # a mix: the validation rows of each source, reported apart
        for row, tag in zip(rows[r.cfg.n_train :], tags[r.cfg.n_train :], strict=True):
            parts.setdefault(tag, []).append(row)
    bundle = build_sentence_data(
        r.cfg,
        tokenizer=r.tokenizer,
        train_lines=train,
        valid_lines=valid,
        in_memory=True,
        valid_parts=parts,
        **r.common,
    )
    return bundle, info


# derived views (the wire's copy of the default map is checked against this one)
GENERATOR_OF_ARCH = {g.arch: g.name for g in GENERATORS.values()}
PARAMS: dict[str, type] = {g.name: g.params for g in GENERATORS.values()}


def _generator(cfg: DataConfig, arch: str) -> Generator:
    gen = get_generator(cfg.generator or GENERATOR_OF_ARCH.get(arch, DEFAULT_GENERATOR))
    if arch != gen.arch and arch not in gen.also_for:
        raise ConfigError(
            "data.generator", f"{gen.name!r} makes data for model.arch {gen.arch!r}, not {arch!r}"
        )
    return gen


def build_synthetic_data(
    cfg: DataConfig,
    *,
    arch: str,
    batch_size: int,
    seed: int,
    workdir: str | Path | None,
    tokenizer: str | None = None,
) -> DataBundle:
    """In-memory sources for ``cfg.generator`` (every epoch a full random permutation);
    ``tokenizer`` is the tokenizer.json of ``stdlib_text`` sentences (``hf_bert``)."""
    gen = _generator(cfg, arch)
    params = parse_params(gen.name, cfg.params)
    names = (f"<synthetic {gen.name} train>", f"<synthetic {gen.name} valid>")
    request = Request(cfg, params, names, workdir, tokenizer, batch_size, seed)
    bundle, info = gen.build(request)
    bundle.info.update({"synthetic": info, "n_train": cfg.n_train, "n_valid": cfg.n_valid})
    return bundle


@dataclass
class SyntheticFiles:
    """Files written by :func:`write_synthetic` and how to load them."""

    kind: str
    train: str
    valid: str | None
    info: dict[str, Any] = field(default_factory=dict)

    def config(self, **changes: Any) -> DataConfig:
        """A :class:`DataConfig` that reads these files (``changes`` override fields)."""
        return DataConfig(kind=self.kind, train=self.train, valid=self.valid, **changes)


def write_synthetic(
    generator: str,
    directory: str | Path,
    *,
    n_train: int,
    n_valid: int = 0,
    seed: int = 0,
    params: Mapping[str, Any] | None = None,
    fmt: str | None = None,
) -> SyntheticFiles:
    """Write ``train.<ext>`` (and ``valid.<ext>`` if ``n_valid``) in the real file format.

    ``fmt`` only matters for a generator with several formats (``nli``: ``"jsonl"``, the
    default, or ``"csv"`` with columns premise, hypothesis, label).
    """
    gen = get_generator(generator)
    p = parse_params(generator, params)
    kind = gen.formats[0] if fmt is None or len(gen.formats) == 1 else fmt
    if kind not in gen.formats:
        raise ValueError(f"fmt must be {' or '.join(map(repr, gen.formats))}, got {fmt!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{part}{SUFFIX[kind]}" for part in ("train", "valid")]
    info = gen.write(paths, p, n_train, n_train + n_valid, seed, kind)
    if not n_valid:
        paths[1].unlink()
    info = {**info, "n_train": n_train, "n_valid": n_valid}
    return SyntheticFiles(kind, str(paths[0]), str(paths[1]) if n_valid else None, info)

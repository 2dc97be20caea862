"""Synthetic data for every workload: in memory (``kind="synthetic"``) or written as files.

One generator per architecture (``data.generator``, default the architecture's own):

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
from collections.abc import Mapping
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
from engine.data.stdlib_text import StdlibTextParams, generate_stdlib_text
from engine.data.synthetic_tabular import (
    CriteoParams,
    MLPParams,
    criteo_lines,
    generate_criteo,
    generate_mlp,
)
from engine.data.synthetic_text import MLMParams, NLIParams, generate_mlm, generate_nli
from engine.data.text import build_pair_data

__all__ = [
    "GENERATOR_OF_ARCH",
    "PARAMS",
    "SyntheticFiles",
    "parse_params",
    "build_synthetic_data",
    "write_synthetic",
]

GENERATOR_OF_ARCH = {
    "transformer": "nli",
    "dlrm": "criteo",
    "mlm": "mlm",
    "mlp": "mlp",
    "hf_bert": "stdlib_text",
}
ARCH_OF_GENERATOR = {g: a for a, g in GENERATOR_OF_ARCH.items()}
PARAMS: dict[str, type] = {
    "nli": NLIParams,
    "criteo": CriteoParams,
    "mlm": MLMParams,
    "mlp": MLPParams,
    "stdlib_text": StdlibTextParams,
}
FILE_KIND = {"nli": "jsonl", "criteo": "criteo", "mlm": "text", "mlp": "npz", "stdlib_text": "text"}
SUFFIX = {"jsonl": ".jsonl", "csv": ".csv", "criteo": ".tsv", "text": ".txt", "npz": ".npz"}


def parse_params(generator: str, params: Mapping[str, Any] | None) -> Any:
    """The validated parameter dataclass of ``generator`` (errors name ``data.params.<x>``)."""
    if generator not in PARAMS:
        raise ConfigError("data.generator", f"must be one of {sorted(PARAMS)}, got {generator!r}")
    return params_from_dict(PARAMS[generator], dict(params or {}), generator)


# generators that also feed the ``hf`` workload (sentences; pairs with their labels)
HF_GENERATORS = ("stdlib_text", "nli")


def _generator(cfg: DataConfig, arch: str) -> str:
    gen = cfg.generator or GENERATOR_OF_ARCH.get(arch, "stdlib_text")
    if arch == "hf" and gen in HF_GENERATORS:
        return gen
    if ARCH_OF_GENERATOR[gen] != arch:
        raise ConfigError(
            "data.generator",
            f"{gen!r} makes data for model.arch {ARCH_OF_GENERATOR[gen]!r}, not {arch!r}",
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
    params = parse_params(gen, cfg.params)
    nt, n = cfg.n_train, cfg.n_train + cfg.n_valid
    names = (f"<synthetic {gen} train>", f"<synthetic {gen} valid>")
    common: dict[str, Any] = {"batch_size": batch_size, "seed": seed}
    if gen == "nli":
        rows, info = generate_nli(n, cfg.synthetic_seed, params)
        pairs = [(i + 1, a, b, y) for i, (a, b, y) in enumerate(rows)]
        tr, va = pairs[:nt], pairs[nt:]
        bundle = build_pair_data(
            cfg,
            workdir=workdir,
            names=names,
            train_rows=lambda: tr,
            valid_rows=(lambda: va) if va else None,
            in_memory=True,
            **common,
        )
    elif gen == "mlm":
        lines, info = generate_mlm(n, cfg.synthetic_seed, params)
        numbered = [(i + 1, s) for i, s in enumerate(lines)]
        tr_l, va_l = numbered[:nt], numbered[nt:]
        bundle = build_mlm_data(
            cfg,
            workdir=workdir,
            names=names,
            train_lines=lambda: tr_l,
            valid_lines=(lambda: va_l) if va_l else None,
            in_memory=True,
            **common,
        )
    elif gen == "stdlib_text":
        if tokenizer is None:
            raise ConfigError("data.tokenizer", "the stdlib_text generator needs a tokenizer.json")
        sentences, info = generate_stdlib_text(n, cfg.synthetic_seed, params)
        numbered = [(i + 1, s) for i, s in enumerate(sentences)]
        tr_s, va_s = numbered[:nt], numbered[nt:]
        bundle = build_sentence_data(
            cfg,
            tokenizer=tokenizer,
            train_lines=lambda: tr_s,
            valid_lines=(lambda: va_s) if va_s else None,
            in_memory=True,
            **common,
        )
    elif gen == "criteo":
        raw, info = generate_criteo(n, cfg.synthetic_seed, params)
        rows_per_table = cfg.table_rows()
        parsed = list(parse_criteo(enumerate(raw, 1), rows_per_table, names[0]))
        tr_c, va_c = parsed[:nt], parsed[nt:]
        train, valid = train_valid_sources(
            lambda: tr_c,
            (lambda: va_c) if va_c else None,
            collate=lambda ex, _seed: collate_criteo(ex),
            shuffle_buffer=nt if cfg.shuffle_buffer else 0,
            drop_last=cfg.drop_last,
            valid_every=0,
            counts=(nt, len(va_c) or None),
            length_buckets=cfg.length_buckets,
            **common,
        )
        bundle = DataBundle(
            train, valid, dlrm_overrides(rows_per_table), {}, {"num_rows": list(rows_per_table)}
        )
    else:
        x, y, info = generate_mlp(n, cfg.synthetic_seed, params)
        flat = x.reshape(n, -1)
        ex = [(flat[i], int(y[i])) for i in range(n)]
        tr_a, va_a = ex[:nt], ex[nt:]
        bundle = build_array_data(
            cfg,
            train=lambda: tr_a,
            valid=(lambda: va_a) if va_a else None,
            counts=(nt, len(va_a) or None),
            in_features=flat.shape[1],
            num_classes=params.num_classes,
            in_memory=True,
            **common,
        )
    bundle.info.update({"synthetic": info, "n_train": nt, "n_valid": cfg.n_valid})
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

    ``fmt`` only matters for ``nli``: ``"jsonl"`` (default) or ``"csv"`` (columns premise,
    hypothesis, label). Criteo files are written block by block (memory stays bounded).
    """
    p = parse_params(generator, params)
    kind = FILE_KIND[generator] if fmt is None or generator != "nli" else fmt
    if kind not in ("jsonl", "csv", "criteo", "text", "npz"):
        raise ValueError(f"fmt must be 'jsonl' or 'csv', got {fmt!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{part}{SUFFIX[kind]}" for part in ("train", "valid")]
    sizes = (n_train, n_valid)
    n = n_train + n_valid
    if generator == "criteo":
        blocks, info = criteo_lines(n, seed, p)
        with open(paths[0], "wb") as ft, open(paths[1], "wb") as fv:
            written = 0
            for block in blocks:
                cut = max(0, min(len(block), n_train - written))
                ft.writelines(block[:cut])
                fv.writelines(block[cut:])
                written += len(block)
    elif generator == "nli":
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
    elif generator in ("mlm", "stdlib_text"):
        make = generate_mlm if generator == "mlm" else generate_stdlib_text
        lines, info = make(n, seed, p)
        for path, part in zip(paths, (lines[:n_train], lines[n_train:]), strict=True):
            path.write_text("".join(s + "\n" for s in part), encoding="utf-8")
    else:
        x, y, info = generate_mlp(n, seed, p)
        for path, sl in zip(paths, (slice(0, n_train), slice(n_train, n)), strict=True):
            with open(path, "wb") as f:
                np.savez(f, x=x[sl], y=y[sl])
    if not n_valid:
        paths[1].unlink()
    info = {**info, "n_train": sizes[0], "n_valid": sizes[1]}
    return SyntheticFiles(kind, str(paths[0]), str(paths[1]) if n_valid else None, info)

"""Training data for the CoMERA trainer: streaming file loaders and synthetic generators.

Public API::

    DataConfig                     what to load (kind, paths, task fields, split, shuffle)
    build_data(config, *, arch, batch_size, seed, workdir=None) -> DataBundle
    DataBundle                     train / valid BatchSource, model_overrides, artifacts, info
    BatchSource.batches(epoch, start=0) -> Iterator[dict[str, Tensor]]   (pure in (seed, epoch))
    BatchSource.num_batches() -> int | None   (None until a pass has counted the examples)
    BatchSource.count() -> int               one counting pass, so num_batches() is known
    DataError                      a malformed input row: file, line, what was expected
    write_synthetic(generator, directory, *, n_train, n_valid, seed, params, fmt)
    register_kind(name, *, archs)  decorator: a bundle builder (config, Load) -> DataBundle
                                   becomes data.kind ``name`` (DATA_KINDS); generators register
                                   likewise (engine.data.synthetic.register_generator)

Kinds per architecture (batch keys in :mod:`engine.models.registry`):

    transformer  jsonl, csv      input_ids, token_type_ids, attention_mask, labels
    dlrm         criteo          dense, sparse, labels
    mlm          text            input_ids, attention_mask, labels (-100 = not masked)
    mlp          npz             x, labels
    hf_bert      text            input_ids, attention_mask, token_type_ids (one sentence a line)
    hf           text            the same (causal_lm, masked_lm, sentence_embedding)
    hf           jsonl, csv      input_ids, token_type_ids, attention_mask, labels (classification)
    any          synthetic       the architecture's generator, in memory

``hf_bert`` and ``hf`` tokenize with ``data.tokenizer`` or else the ``tokenizer.json`` of the
model directory (``model_config["path"]``, passed by the trainer; for ``hf`` from a config,
``model_config["tokenizer"]``). For ``hf`` the bundle's model fields are the tokenizer's pad
and mask ids, its vocabulary size and, for classification, the number of labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.configs import ConfigError
from engine.data.arrays import build_npz_data
from engine.data.config import DataConfig
from engine.data.criteo import build_criteo_data
from engine.data.errors import DataError
from engine.data.lines import build_mlm_data, read_text
from engine.data.sentences import build_sentence_data
from engine.data.source import BatchSource, DataBundle, StreamSource
from engine.data.synthetic import SyntheticFiles, build_synthetic_data, write_synthetic
from engine.data.text import build_pair_data, read_pairs

__all__ = [
    "DataConfig",
    "DataBundle",
    "BatchSource",
    "StreamSource",
    "DataError",
    "DataKind",
    "DATA_KINDS",
    "Load",
    "build_data",
    "register_kind",
    "write_synthetic",
    "SyntheticFiles",
    "ARCHS",
    "ARCH_OF_KIND",
    "OTHER_ARCHS_OF_KIND",
    "hf_tokenizer",
]

ARCHS = ("transformer", "dlrm", "mlm", "mlp", "hf_bert", "hf")
HF_ARCHS = ("hf_bert", "hf")  # the archs whose tokenizer is the model's own


@dataclass(frozen=True)
class Load:
    """What a kind's builder gets besides the data config."""

    arch: str
    tokenizer: str | None  # the model's own tokenizer.json (``HF_ARCHS``), else None
    workdir: str | Path | None
    batch_size: int
    seed: int

    @property
    def common(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "seed": self.seed}


BuildKind = Callable[[DataConfig, Load], DataBundle]


@dataclass(frozen=True)
class DataKind:
    """A registered ``data.kind``: the architectures it feeds and how its bundle is built."""

    name: str
    archs: tuple[str, ...]  # the architectures it feeds, its main one (named in errors) first
    build: BuildKind


DATA_KINDS: dict[str, DataKind] = {}


def register_kind(name: str, *, archs: tuple[str, ...]) -> Callable[[BuildKind], BuildKind]:
    """Register the decorated bundle builder as ``data.kind`` ``name`` (decorators stack: one
    builder may serve several kinds)."""

    def register(build: BuildKind) -> BuildKind:
        if name in DATA_KINDS:
            raise ValueError(f"data kind {name!r} is already registered")
        DATA_KINDS[name] = DataKind(name, archs, build)
        return build

    return register


def _check_files(config: DataConfig) -> None:
    for name in ("train", "valid", "tokenizer"):
        path = getattr(config, name)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"data.{name}", f"no such file {path!r}")


def hf_tokenizer(config: DataConfig, model_config: Mapping[str, Any] | None, arch: str) -> str:
    """``data.tokenizer``, else ``tokenizer.json`` of the model directory, else (``hf`` from
    a config) ``model.config.tokenizer``."""
    if config.tokenizer is not None:
        return config.tokenizer
    path = (model_config or {}).get("path")
    own = (model_config or {}).get("tokenizer") if arch == "hf" else None
    if path is None and isinstance(own, str):
        if not Path(own).is_file():
            raise ConfigError("model.config.tokenizer", f"no such file {own!r}")
        return own
    if path is None:
        raise ConfigError(
            "data.tokenizer",
            f"model.arch {arch!r} needs the model's tokenizer: set "
            "model.config.path (its tokenizer.json is used) or data.tokenizer",
        )
    from engine.models.hf_bert.config import check_model_dir

    try:
        return str(check_model_dir(path) / "tokenizer.json")
    except ConfigError as err:  # about model.config.path
        raise err.under("model.config") from None


def _names(config: DataConfig) -> tuple[str, str]:
    return (config.train or "", config.valid or "")


@register_kind("csv", archs=("transformer", "hf"))
@register_kind("jsonl", archs=("transformer", "hf"))  # (the lower decorator registers first)
def _pairs(config: DataConfig, load: Load) -> DataBundle:
    names = _names(config)
    return build_pair_data(
        config,
        workdir=load.workdir,
        names=names,
        in_memory=False,
        train_rows=lambda: read_pairs(names[0], config.kind, config),
        valid_rows=None
        if config.valid is None
        else (lambda: read_pairs(names[1], config.kind, config)),
        **load.common,
    )


@register_kind("criteo", archs=("dlrm",))
def _criteo(config: DataConfig, load: Load) -> DataBundle:
    return build_criteo_data(config, **load.common)


@register_kind("text", archs=("mlm", "hf_bert", "hf"))
def _text(config: DataConfig, load: Load) -> DataBundle:
    """One sentence a line, encoded by the model's own tokenizer (``hf_bert``, ``hf``);
    without one, masked-LM lines (``mlm``: tokenizer given or trained in the workdir)."""
    names = _names(config)

    def train_lines() -> Any:
        return read_text(names[0])

    valid_lines = None if config.valid is None else (lambda: read_text(names[1]))
    if load.tokenizer is not None:
        return build_sentence_data(
            config,
            tokenizer=load.tokenizer,
            in_memory=False,  # type: ignore[arg-type]
            train_lines=train_lines,
            valid_lines=valid_lines,
            **load.common,
        )
    return build_mlm_data(
        config,
        workdir=load.workdir,
        names=names,
        in_memory=False,
        train_lines=train_lines,
        valid_lines=valid_lines,
        **load.common,
    )


@register_kind("npz", archs=("mlp",))
def _npz(config: DataConfig, load: Load) -> DataBundle:
    return build_npz_data(config, **load.common)


@register_kind("synthetic", archs=ARCHS)
def _synthetic(config: DataConfig, load: Load) -> DataBundle:
    return build_synthetic_data(
        config, arch=load.arch, workdir=load.workdir, tokenizer=load.tokenizer, **load.common
    )


# views of the registry: the main architecture of each file kind, and the others it feeds
ARCH_OF_KIND = {k.name: k.archs[0] for k in DATA_KINDS.values() if k.name != "synthetic"}
OTHER_ARCHS_OF_KIND = {
    k.name: k.archs[1:] for k in DATA_KINDS.values() if k.name != "synthetic" and k.archs[1:]
}


def build_data(
    config: DataConfig,
    *,
    arch: str,
    batch_size: int,
    seed: int,
    workdir: str | Path | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> DataBundle:
    """Sources and model fields for ``arch`` from ``config``.

    A trained tokenizer (and inferred label list) is saved in ``workdir`` and reused from
    there when present, so a resumed job encodes exactly as before. Nothing is read here
    beyond what the setup needs: a tokenizer / label pass for text, NPZ headers and labels.
    ``model_config`` (the job's ``model.config``) names the model directory of ``hf_bert``.
    """
    if arch not in ARCHS:
        raise ConfigError("model.arch", f"must be one of {list(ARCHS)} for data, got {arch!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    kind = DATA_KINDS.get(config.kind)
    if kind is None:
        raise ConfigError("data.kind", f"must be one of {list(DATA_KINDS)}, got {config.kind!r}")
    if arch not in kind.archs:
        raise ConfigError(
            "data.kind", f"{config.kind!r} feeds model.arch {kind.archs[0]!r}, not {arch!r}"
        )
    _check_files(config)
    tokenizer = hf_tokenizer(config, model_config, arch) if arch in HF_ARCHS else None
    if arch == "hf":
        config = config.replace(tokenizer=tokenizer)
    bundle = kind.build(config, Load(arch, tokenizer, workdir, batch_size, seed))
    if arch == "hf":
        bundle.model_overrides = hf_overrides(tokenizer, bundle.info, config.max_len)
    bundle.info.update(
        {"kind": config.kind, "arch": arch, "batch_size": batch_size, "split": _split_doc(config)}
    )
    return bundle


def hf_overrides(tokenizer: str, info: Mapping[str, Any], max_len: int) -> dict[str, Any]:
    """The ``hf`` model fields the data decides: pad / mask ids, vocabulary, labels."""
    from engine.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    padding = tok.padding
    pad = padding["pad_id"] if padding else None
    for name in ("[PAD]", "<pad>", "<|endoftext|>", "</s>"):
        if pad is None:
            pad = tok.token_to_id(name)
    mask = next((i for i in map(tok.token_to_id, ("[MASK]", "<mask>")) if i is not None), None)
    out: dict[str, Any] = {"tokenizer_vocab_size": tok.get_vocab_size(), "max_len": max_len}
    if pad is not None:
        out["pad_token_id"] = int(pad)
    if mask is not None:
        out["mask_token_id"] = int(mask)
    if info.get("labels"):
        out["num_labels"] = len(info["labels"])
    return out


def _split_doc(config: DataConfig) -> str:
    if config.valid is not None:
        return "file"
    if config.kind == "synthetic":
        return "generated" if config.n_valid else "none"
    if config.valid_every:
        return f"every {config.valid_every}-th training row (index % k == k - 1)"
    return "none"

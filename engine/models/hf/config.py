"""``model.config`` of the ``hf`` workload: a Hugging Face model, pretrained or from a config.

Two starts (exactly one of ``path`` / ``hf_config``):

* ``path``: a directory holding ``config.json`` and ``model.safetensors`` (a tokenizer
  beside them, ``tokenizer.json``, unless ``data.tokenizer`` names one), or
  ``pkg:<package>/<sub/dir>`` inside an installed Python package. The weights are the
  original's: the student starts from their TT-SVD (refitted to the original's outputs on
  ``calibration_sentences`` training sentences with ``init: "whitened"``, the default, or,
  for a BERT sentence encoder, fitted block by block to the original's outputs on the
  compressed student's inputs with ``init: "sequential"``; see
  :mod:`engine.models.hf.prepare`) and distils from the frozen original. With
  ``rank_allocation: "energy"`` the whitened start spends the TT entries of the uniform
  ``compression.max_rank`` (or the dense entries over ``target_compression``) where the
  original's whitened spectra say they matter most; ``"sensitivity"`` (a BERT sentence
  encoder) weighs each layer by what its error costs the sentence embedding.
  ``train_embeddings: false`` keeps the student's input embeddings at the original's.
  Only safetensors weights are ever read; pickles and the directory's own code never are.
* ``hf_config``: the contents of a ``config.json`` (``model_type`` one of
  :data:`~engine.models.hf.families.FAMILIES`): random TT cores trained from scratch, the
  CoMERA path. ``tokenizer`` (or ``data.tokenizer``) names the ``tokenizer.json``.

``task`` picks transformers' Auto class and the loss: ``causal_lm`` (next-token cross-entropy;
metric perplexity), ``masked_lm`` (15% of tokens masked; accuracy and perplexity),
``sequence_classification`` (``num_labels`` classes, filled in from the data; accuracy),
``sentence_embedding`` (mean-pooled last hidden state, cosine to the original's; pretrained
only). ``pad_token_id``, ``mask_token_id``, ``tokenizer_vocab_size`` and ``max_len`` come
from the data (its tokenizer and ``data.max_len``). With a pretrained start the loss is
``task_weight * task + distill_weight * distillation`` (:mod:`engine.models.hf.losses`): KL
divergence of the logits at ``temperature`` for the LM tasks, of the last hidden states for
classification, ``1 - cos`` of the sentence embeddings (plus ``token_weight`` times that of
each token's last hidden state).

``targets`` replaces the family's default layers (its blocks' attention and MLP linears,
:mod:`engine.models.hf.families`) by module-name suffixes; ``tensorize_lm_head`` and
``tensorize_embeddings`` add the output projection and the input embedding (a TTM table).
``compression.layers`` then filters the candidates by ``fnmatch`` pattern as for every
workload. Every export writes ``model/hf/`` (a directory transformers loads with
``trust_remote_code``; :mod:`engine.export.hf_export`), and with ``export_dense`` also
``model/dense/`` (the standard architecture). After a build the validated ``config.json``
is held in ``hf_config`` (``path`` dropped in :meth:`HFConfig.portable_dict`), which is what
a compressed checkpoint rebuilds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.configs import ConfigError, ConfigMethods, spec, validate
from engine.models.hf.families import DROPOUT_FIELDS, SIZE_BOUNDS, TASKS, family_of
from engine.models.hf_bert.config import MAX_PATH, check_embedding_choices, resolve_model_dir

__all__ = ["HFConfig", "check_hf_config", "model_directory", "read_hf_config", "MAX_CONFIG_BYTES"]

CONFIG_VERSION = 1
INITS = ("tt_svd", "whitened", "sequential")
ALLOCATIONS = ("uniform", "energy", "sensitivity")
SEQUENTIAL_TYPES = ("bert",)  # the layer structure engine.models.hf_bert.calib stages
MAX_CONFIG_BYTES = 256 * 1024
WEIGHTS_FILE = "model.safetensors"
# keys of a config.json that name code or files elsewhere: never kept
_DROPPED = ("auto_map", "_name_or_path", "transformers_version", "architectures")


def check_hf_config(data: object) -> dict[str, Any]:
    """A validated copy of a parsed ``config.json`` (sizes bounded, family known)."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"must be a JSON object, got {type(data).__name__}")
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ConfigError("", f"must be plain JSON ({err})") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"must be at most {MAX_CONFIG_BYTES} bytes as JSON")
    try:
        family_of(data.get("model_type"))
    except ValueError as err:
        raise ConfigError("model_type", str(err)) from None
    for name, bound in SIZE_BOUNDS.items():
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            raise ConfigError(name, f"must be an integer in [1, {bound:,}], got {value!r}")
    if data.get("is_encoder_decoder") or data.get("add_cross_attention"):
        raise ConfigError("is_encoder_decoder", "encoder-decoder models are not supported")
    out = {k: v for k, v in json.loads(text).items() if k not in _DROPPED}
    _transformers_config(out)  # transformers itself accepts it
    return out


def _transformers_config(data: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    rest = {k: v for k, v in data.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(data["model_type"], **rest)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ConfigError("", f"transformers refuses it: {err}") from None


def model_directory(path: str) -> Path:
    """The resolved directory of ``path`` after checking its config and weights files."""
    directory = resolve_model_dir(path)
    if not directory.is_dir():
        raise ConfigError("path", f"{path!r} is not a directory")
    if not (directory / "config.json").is_file():
        raise ConfigError("path", f"{path!r} has no config.json")
    if not (directory / WEIGHTS_FILE).is_file():
        raise ConfigError(
            "path",
            f"{path!r} has no {WEIGHTS_FILE} (weights are read from safetensors only; "
            "pickled formats such as pytorch_model.bin are never loaded)",
        )
    return directory


def read_hf_config(directory: Path) -> dict[str, Any]:
    """The validated ``config.json`` of ``directory``; errors name the file and field."""
    file = directory / "config.json"
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError("path", f"config.json is over {MAX_CONFIG_BYTES} bytes")
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError("path", f"cannot read config.json as JSON ({err})") from None
    try:
        return check_hf_config(data)
    except ConfigError as err:
        where = f".{err.field}" if err.field else ""
        raise ConfigError("path", f"config.json{where}: {err.message}") from None


@dataclass(frozen=True)
class HFConfig(ConfigMethods):
    """``model.config`` of the ``hf`` workload (see the module docstring)."""

    task: str = spec("causal_lm", choices=tuple(TASKS))
    path: str | None = spec(None, length=(1, MAX_PATH))
    hf_config: dict[str, Any] | None = None
    tokenizer: str | None = spec(None, length=(1, MAX_PATH))
    targets: tuple[str, ...] | None = spec(None, length=(1, 64))
    tensorize_lm_head: bool = False
    tensorize_embeddings: bool = False
    num_labels: int | None = spec(None, ge=1, le=10_000)  # from the data when not given
    pad_token_id: int | None = spec(None, ge=0, le=1_000_000)  # from the tokenizer
    mask_token_id: int | None = spec(None, ge=0, le=1_000_000)  # from the tokenizer
    tokenizer_vocab_size: int | None = spec(None, ge=1, le=1_000_000)  # from the tokenizer
    max_len: int | None = spec(None, ge=2, le=131_072)  # data.max_len
    task_weight: float = spec(1.0, ge=0, le=1e6)
    distill_weight: float = spec(1.0, ge=0, le=1e6)
    temperature: float = spec(2.0, gt=0, le=100)
    # sentence_embedding: also distil every token's last hidden state (1 - cos, this weight)
    token_weight: float = spec(0.0, ge=0, le=1e6)
    export_dense: bool = False  # also write model/dense/: the TT layers multiplied out
    # every dropout probability of the model (DROPOUT_FIELDS its config has) set to this while
    # training; None: the config.json's own. Distilling into a compressed copy of a pretrained
    # model usually wants 0: dropout noise in the student is error the teacher does not have
    dropout: float | None = spec(None, ge=0, lt=1)
    # pretrained start: "whitened" (activation-aware TT-SVD, engine/models/hf/prepare.py) or
    # "sequential" (BERT sentence embeddings: each layer fitted on the student's own inputs)
    init: str = spec("whitened", choices=INITS)
    calibration_sentences: int = spec(256, ge=1, le=1_000_000)  # what the init looks at
    # "uniform": every layer at compression.max_rank; "energy" (a pretrained start): the same TT
    # entries spread over the layers by their whitened spectra (engine/models/hf/prepare.py)
    rank_allocation: str = spec("uniform", choices=ALLOCATIONS)
    # the allocation's budget as a compression factor (dense / TT entries of the tensorized
    # linears); None: the uniform build's entries (every layer at compression.max_rank)
    target_compression: float | None = spec(None, gt=1, le=10_000)
    probe_sentences: int = spec(32, ge=1, le=100_000)  # "sensitivity": the probe sentences
    depth_gain: float = spec(2.0, ge=0.1, le=10)  # "sensitivity": block i's weight x gain ** i
    # False: the student's input embeddings (BERT-style: the whole embeddings module; others:
    # the token and absolute position tables) stay the original's and get no optimizer state
    train_embeddings: bool = True
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)
        if self.targets is not None and not all(0 < len(t) <= 128 for t in self.targets):
            raise ConfigError("targets", "must list module-name suffixes of 1-128 characters")
        if (self.path is None) == (self.hf_config is None):
            raise ConfigError(
                "path",
                "give exactly one of path (a pretrained directory) and hf_config (a "
                "config.json's contents, to train from scratch)",
            )
        if self.path is not None:
            config = read_hf_config(model_directory(self.path))
        else:
            try:
                config = check_hf_config(self.hf_config)
            except ConfigError as err:
                raise err.under("hf_config") from None
        family = family_of(config["model_type"])
        if self.task not in family.tasks:
            raise ConfigError(
                "task",
                f"{self.task!r} is not offered for model_type {family.model_type!r} "
                f"(choose one of {list(family.tasks)})",
            )
        if self.init == "sequential" and (
            self.path is None
            or family.model_type not in SEQUENTIAL_TYPES
            or self.task != "sentence_embedding"
        ):
            raise ConfigError(
                "init",
                f"'sequential' needs a pretrained encoder (path) of model_type "
                f"{list(SEQUENTIAL_TYPES)} and task 'sentence_embedding'; got model_type "
                f"{family.model_type!r}, task {self.task!r}",
            )
        self._check_allocation(family.model_type)
        check_embedding_choices(self.tensorize_embeddings, self.train_embeddings)
        vocab = config.get("vocab_size")
        if self.tokenizer_vocab_size is not None and vocab and self.tokenizer_vocab_size > vocab:
            raise ConfigError(
                "tokenizer",
                f"the tokenizer has {self.tokenizer_vocab_size} tokens, more than the "
                f"model's vocab_size {vocab}",
            )
        positions = config.get("max_position_embeddings") or config.get("n_positions")
        if family.model_type == "roberta" and positions:
            positions -= 2  # its position ids start after the padding index
        if self.max_len is not None and positions and self.max_len > positions:
            raise ConfigError(
                "max_len",
                f"data.max_len {self.max_len} is longer than the model's {positions} positions",
            )
        object.__setattr__(self, "_config", config)

    def _check_allocation(self, model_type: str) -> None:
        if self.rank_allocation == "uniform":
            if self.target_compression is not None:
                raise ConfigError(
                    "target_compression",
                    "needs rank_allocation 'energy' or 'sensitivity'; with 'uniform' every "
                    "layer is at compression.max_rank",
                )
            return
        if self.path is None or self.init == "tt_svd":
            raise ConfigError(
                "rank_allocation",
                f"{self.rank_allocation!r} needs a pretrained start (path) with init "
                f"'whitened' or 'sequential': it spreads the ranks by the original's whitened "
                f"spectra; got init {self.init!r}" + ("" if self.path else " and no path"),
            )
        if self.rank_allocation == "sensitivity" and (
            model_type not in SEQUENTIAL_TYPES or self.task != "sentence_embedding"
        ):
            raise ConfigError(
                "rank_allocation",
                f"'sensitivity' probes the sentence embedding of an encoder of model_type "
                f"{list(SEQUENTIAL_TYPES)} (task 'sentence_embedding'); got model_type "
                f"{model_type!r}, task {self.task!r}",
            )
        if self.target_compression is not None:
            object.__setattr__(self, "target_compression", float(self.target_compression))

    @property
    def config_json(self) -> dict[str, Any]:
        """The validated ``config.json`` (read from ``path`` or given as ``hf_config``)."""
        return dict(self.__dict__["_config"])

    @property
    def pooled_distillation(self) -> bool:
        """Whether the loss reads the teacher only through its mean-pooled embedding (a
        ``sentence_embedding`` without ``token_weight``): a table of the training split's
        may then stand in for the teacher (:mod:`engine.models.hf_bert.cache`)."""
        return self.task == "sentence_embedding" and self.token_weight == 0

    @property
    def pretrained(self) -> bool:
        return self.path is not None

    @property
    def model_dir(self) -> Path | None:
        return None if self.path is None else model_directory(self.path)

    def transformers_config(self) -> Any:
        """The ``transformers`` config object (``num_labels``, ``dropout`` applied)."""
        config = _transformers_config(self.config_json)
        if self.dropout is not None:
            for name in DROPOUT_FIELDS:
                if hasattr(config, name):
                    setattr(config, name, self.dropout)
        if self.num_labels is not None:
            config.num_labels = self.num_labels
        if self.pad_token_id is not None:
            config.pad_token_id = self.pad_token_id
        return config

    def portable_dict(self) -> dict[str, Any]:
        """What rebuilds the architecture without the original: ``hf_config``, no ``path``.
        The start's choices that need the original (``init: "sequential"``, an ``energy``
        ``rank_allocation``) fall back to their path-free values: a rebuilt model takes its
        weights and ranks from the checkpoint, not from a start."""
        out = {**self.to_dict(), "path": None, "hf_config": self.config_json}
        out["rank_allocation"] = "uniform"
        out["target_compression"] = None
        if out["init"] == "sequential":
            out["init"] = "whitened"
        return out

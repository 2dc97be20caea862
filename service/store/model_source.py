"""The pretrained model of an ``hf_bert`` or ``hf`` job (``model.source``), checked without torch.

The API checks a source when a job is submitted (a 422 naming ``/model/source/...``) and the
worker checks it again, against its own data root, before it builds the model: the roots of
the two processes may differ, and the directory may have changed in between. Both go through
:mod:`service.store.prepare` (``prepare_job`` at submission; ``worker_engine_config``, which
resolves only this root-relative path again in the stored engine config).

* ``hf_dir``: ``path`` relative to the data root (``settings.data``). The directory is
  resolved (symlinks followed) and must stay inside the resolved root; so must each file read
  from it (a symlinked ``config.json`` may not leave the root either).
* ``package``: the ``model`` directory of an allow-listed installed package
  (``api_schemas.jobs.HF_PACKAGES``), found with :func:`importlib.util.find_spec`, which
  locates the package without importing it.

A directory must hold ``config.json`` (at most ``MAX_CONFIG_BYTES``, nested at most
``service.store.json_limits.MAX_DEPTH`` levels; a JSON object with the fixed values the engine
builds (``model_type: "bert"``, ``hidden_act: "gelu"``, absolute positions, no decoder) and
the weight-shaping sizes as integers within the engine's bounds, ``MAX_PARAMS`` parameters at
most), ``model.safetensors`` (its header is parsed: an 8-byte little-endian length, at most
``MAX_HEADER_BYTES`` of JSON nested as deep at most, every tensor's dtype, shape and byte
range as :mod:`service.store.model_files` checks them, the word embedding and the last
layer's output weight shaped as ``config.json`` says) and ``tokenizer.json`` (a tokenizer with
BERT's special tokens, :mod:`service.store.model_files`). Files are named relative to the
data root in every message. Pickled weights (``pytorch_model.bin``, ``*.pt``, ...) are never
opened: a directory that has only those is refused with the reason. The engine checks every
weight's name and shape when the worker loads the model (the dry-run planner builds the bare
architecture on the ``meta`` device and reads no weights).

An ``hf`` job's directory holds the same three files, checked for its family instead of
BERT's (:mod:`service.store.hf_model_dir`); its ``hf_config`` source names a
``tokenizer.json`` under the data root, checked as the directory's would be; its
``uploaded`` source names a model of the job's tenant (``POST /v1/models``), whose directory
under the artifact root is checked again the same way (``/model/source/id``).
"""

from __future__ import annotations

import importlib.util
import json
from itertools import islice
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from api_schemas.engine_spec import SpecError, package_path
from api_schemas.hf_model import BERT_TOKEN_TYPES, HFConfigSource, UploadedSource
from api_schemas.jobs import HFDirSource, ModelSpec
from service.store import paths
from service.store.db.crud.uploads import MODELS
from service.store.hf_model_dir import MAX_CONFIG_BYTES, check_hf_files, read_config_json
from service.store.model_files import check_tokenizer, read_header

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_PARAMS",
    "REQUIRED_FILES",
    "check_model_dir",
    "estimate_params",
    "resolve_model_source",
]

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER_BYTES = 16 << 20
MAX_PARAMS = 500_000_000  # BERT-large has 335 M
MAX_WEIGHT_BYTES = 4 * MAX_PARAMS + MAX_HEADER_BYTES + 8  # float32 at most
# config.json sizes and their upper bounds (as engine.models.hf_bert.config)
SIZES = {
    "vocab_size": 1_000_000,
    "hidden_size": 8192,
    "num_hidden_layers": 64,
    "num_attention_heads": 128,
    "intermediate_size": 32768,
    "max_position_embeddings": 8192,
    "type_vocab_size": 64,
}
# config.json fields with the one value the engine builds: (name, value, default if absent)
FIXED = (
    ("model_type", "bert", None),
    ("hidden_act", "gelu", "gelu"),
    ("position_embedding_type", "absolute", "absolute"),
    ("is_decoder", False, False),
    ("add_cross_attention", False, False),
)
SCAN_ENTRIES = 10_000  # directory entries looked at for pickled weights


# where uploaded models are: a session, the artifact root and the job's tenant
Uploaded = tuple[Session, Path, str]


def _inside(root: Path, path: Path, pointer: str, shown: str) -> Path:
    try:
        resolved = paths.resolve(path)
    except OSError as err:  # a symlink loop (RuntimeError before paths.resolve), a long name
        raise SpecError(pointer, f"cannot read {shown}: {paths.reason(err)}") from None
    if not resolved.is_relative_to(root):
        raise SpecError(
            pointer, f"{shown} resolves outside the data root (a symlink may not leave it)"
        )
    return resolved


def estimate_params(cfg: dict[str, int]) -> int:
    """Parameters of the BERT encoder ``cfg`` describes (embeddings, layers, LayerNorms)."""
    h, f, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    embed = (cfg["vocab_size"] + cfg["max_position_embeddings"] + cfg["type_vocab_size"]) * h
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 4 * h  # attention, FFN, two LNs
    return embed + 2 * h + n * layer


def _check_config(file: Path, pointer: str, shown: str) -> dict[str, Any]:
    data = read_config_json(file, pointer, f"{shown}/config.json")
    if not isinstance(data, dict):
        raise SpecError(pointer, f"{shown}/config.json must hold a JSON object")
    for name, wanted, default in FIXED:
        v = data.get(name, default)
        if v != wanted or isinstance(v, bool) != isinstance(wanted, bool):
            raise SpecError(
                pointer,
                f"{shown}/config.json: {name} must be {json.dumps(wanted)} "
                f"(BERT encoders only), got {json.dumps(v)}",
            )
    for name, high in SIZES.items():
        v = data.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high:
            raise SpecError(
                pointer,
                f"{shown}/config.json: {name} must be an integer in "
                f"[1, {high}], got {json.dumps(v)}",
            )
    if data["hidden_size"] % data["num_attention_heads"]:
        raise SpecError(
            pointer, f"{shown}/config.json: hidden_size must be divisible by num_attention_heads"
        )
    eps, pad = data.get("layer_norm_eps"), data.get("pad_token_id", 0)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise SpecError(
            pointer,
            f"{shown}/config.json: layer_norm_eps must be a number in "
            f"(0, 1), got {json.dumps(eps)}",
        )
    if pad is not None and (
        isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < data["vocab_size"]
    ):
        raise SpecError(
            pointer,
            f"{shown}/config.json: pad_token_id must be an integer in "
            f"[0, vocab_size), got {json.dumps(pad)}",
        )
    params = estimate_params(data)
    if params > MAX_PARAMS:
        raise SpecError(
            pointer,
            f"{shown}/config.json describes {params:,} parameters; at "
            f"most {MAX_PARAMS:,} are accepted",
        )
    return data


def _expected_shapes(cfg: dict[str, Any]) -> dict[str, list[int]]:
    """Two weights whose shapes pin the config: the word embedding and the last layer's."""
    h, last = cfg["hidden_size"], cfg["num_hidden_layers"] - 1
    return {
        "embeddings.word_embeddings.weight": [cfg["vocab_size"], h],
        f"encoder.layer.{last}.output.dense.weight": [h, cfg["intermediate_size"]],
    }


def _check_safetensors(file: Path, pointer: str, shown: str, cfg: dict[str, Any]) -> None:
    """The header of a safetensors file, read without loading any tensor; the shapes of
    :func:`_expected_shapes` must match ``config.json`` (``bert.`` prefix allowed)."""
    size = file.stat().st_size
    where = f"{shown}/model.safetensors"
    if size > MAX_WEIGHT_BYTES:
        raise SpecError(pointer, f"{where} is larger than {MAX_WEIGHT_BYTES:,} bytes")
    header = read_header(file, pointer, where, MAX_HEADER_BYTES)
    for name, shape in _expected_shapes(cfg).items():
        entry = header.get(name, header.get(f"bert.{name}"))
        got = entry.get("shape") if isinstance(entry, dict) else None
        if got != shape:
            raise SpecError(
                pointer,
                f"{where} does not match config.json: {name} is "
                f"{'missing' if got is None else got}, config.json says "
                f"{shape}",
            )


def _present(path: Path) -> bool:
    """There, or a symlink (a dangling or looping one is refused later, with its reason)."""
    return path.exists() or path.is_symlink()


def check_model_dir(
    directory: Path, *, root: Path | None, pointer: str, shown: str, arch: str = "hf_bert"
) -> None:
    """The checks of the module docstring for ``arch``; ``root``: where every file must stay
    (hf_dir)."""
    if not directory.is_dir():
        raise SpecError(pointer, f"no model directory {shown!r}")
    missing = [f for f in REQUIRED_FILES if not _present(directory / f)]
    if "model.safetensors" in missing and any(
        p.name.endswith(PICKLED) for p in islice(directory.iterdir(), SCAN_ENTRIES)
    ):
        raise SpecError(
            pointer,
            f"{shown} holds only pickled weights (e.g. pytorch_model.bin), "
            "which are never loaded: save the model with safetensors "
            "(model.safetensors)",
        )
    if missing:
        raise SpecError(
            pointer,
            f"{shown} lacks {missing} (a Hugging Face model directory holds "
            f"{list(REQUIRED_FILES)})",
        )
    files = {f: directory / f for f in REQUIRED_FILES}
    if root is not None:
        files = {f: _inside(root, p, pointer, f"{shown}/{f}") for f, p in files.items()}
    for f, p in files.items():
        if not p.is_file():
            raise SpecError(pointer, f"{shown}/{f} is not a file")
    if arch == "hf":
        check_hf_files(files, pointer, shown)
        return
    cfg = _check_config(files["config.json"], pointer, shown)
    _check_safetensors(files["model.safetensors"], pointer, shown, cfg)
    check_tokenizer(files["tokenizer.json"], pointer, f"{shown}/tokenizer.json")


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) / "model" if locations else None


def _tokenizer_file(root: Path, rel: str, bert_tokens: bool) -> str:
    """The resolved ``tokenizer.json`` of a ``hf_config`` source, checked."""
    pointer = "/model/source/tokenizer"
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise SpecError(pointer, "must be a relative path under the data root, without '..'")
    try:
        file = _inside(root, root / rel, pointer, repr(rel))
        if not file.is_file():
            raise SpecError(pointer, f"no file {rel!r} under the data root")
        check_tokenizer(file, pointer, rel, bert_tokens=bert_tokens)
    except OSError as err:
        raise SpecError(pointer, f"cannot read {rel!r}: {paths.reason(err)}") from None
    return str(file)


def _uploaded_dir(source: UploadedSource, uploaded: Uploaded | None) -> str:
    """The checked directory of the tenant's uploaded model ``source.id``."""
    pointer = "/model/source/id"
    if uploaded is None:
        raise SpecError(pointer, "an uploaded model is read by the service only")
    session, artifacts, tenant_id = uploaded
    row = MODELS.get(session=session, tenant_id=tenant_id, upload_id=source.id)
    if row is None:
        raise SpecError(pointer, f"no model {source.id!r}")
    root = Path(artifacts).resolve()
    try:
        directory = _inside(root, root / row.path, pointer, source.id)
        check_model_dir(directory, root=directory, pointer=pointer, shown=source.id, arch="hf")
    except OSError as err:
        raise SpecError(pointer, f"cannot read {source.id}: {paths.reason(err)}") from None
    return str(directory)


def resolve_model_source(
    *, data_root: Path, model: ModelSpec, uploaded: Uploaded | None = None
) -> str | None:
    """The engine's ``model.config.path`` of ``model`` (``None`` unless ``hf_bert`` or
    ``hf``): the resolved directory of an ``hf_dir`` under ``data_root`` (the server's data
    root, or ``comera run --data-root``), ``pkg:<name>/model`` of a package, the resolved
    ``tokenizer.json`` of an ``hf_config``, the directory of an ``uploaded`` model found
    with ``uploaded``; raises :class:`SpecError` naming ``/model/source/path``,
    ``/model/source/name``, ``/model/source/tokenizer`` or ``/model/source/id``."""
    source, arch = model.source, model.arch
    if arch not in ("hf_bert", "hf") or source is None:
        return None
    if isinstance(source, UploadedSource):
        return _uploaded_dir(source, uploaded)
    if isinstance(source, HFConfigSource):
        bert_tokens = source.config.get("model_type") in BERT_TOKEN_TYPES
        return _tokenizer_file(Path(data_root).resolve(), source.tokenizer, bert_tokens)
    if isinstance(source, HFDirSource):
        pointer, root = "/model/source/path", Path(data_root).resolve()
        if Path(source.path).is_absolute() or ".." in Path(source.path).parts:
            raise SpecError(pointer, "must be a relative path under the data root, without '..'")
        try:
            directory = _inside(root, root / source.path, pointer, repr(source.path))
            check_model_dir(directory, root=root, pointer=pointer, shown=source.path, arch=arch)
        except OSError as err:  # a name too long, a permission, a loop: not a server error
            raise SpecError(pointer, f"cannot read {source.path!r}: {paths.reason(err)}") from None
        return str(directory)
    pointer = "/model/source/name"
    found = _package_dir(source.name)
    if found is None:
        raise SpecError(pointer, f"the model package {source.name!r} is not installed here")
    try:
        check_model_dir(
            found, root=None, pointer=pointer, shown=f"package {source.name}", arch=arch
        )
    except OSError as err:
        raise SpecError(
            pointer, f"cannot read package {source.name}: {paths.reason(err)}"
        ) from None
    return package_path(source.name)

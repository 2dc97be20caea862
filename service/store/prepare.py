"""One preparation of a job: its files resolved, its model source checked, its spec translated.

:func:`prepare_job` turns a validated ``JobCreate`` into a :class:`PreparedJob`: the dataset
files resolved (:func:`resolve_dataset`), the model source checked and resolved
(:func:`service.store.model_source.resolve_model_source`) and the spec translated once
(:func:`api_schemas.engine_spec.to_engine`) into the engine job dict, which carries its
``version`` (:data:`api_schemas.engine_spec.ENGINE_CONFIG_VERSION`). Its callers:

* the submission path (``service.submission``, ``POST /v1/jobs`` and the dry run), which
  stores that dict as the job's ``engine_config``;
* the planner (``service.planner``), which plans the prepared dict;
* ``comera run`` (``client.local``), with ``--data-root`` as the data root and no store;
* the worker, through :func:`worker_engine_config`: it reads the stored ``engine_config``
  instead of translating the spec again, and re-resolves only the root-relative paths in it
  (the dataset files, an ``hf_dir`` or uploaded model, an ``hf_config`` tokenizer), because
  the worker's data and artifact roots may differ from the API's and the files may have
  changed since. A job stored without a config of this version is prepared afresh.

One resolver for dataset references and one error type, :class:`PrepareError` (a
``SpecError``: a JSON Pointer into the submitted body, a message that names no server path,
and the ``code`` of the API's 422):

* ``synthetic``: no files; the engine generates the data.
* ``upload``: a ``datasets`` row of the job's own tenant in state ``ready``, of the spec's
  ``format``; its file under the artifact root.
* ``path``: a file under the data root, resolved (symlinks followed), which must stay inside
  the root and exist: a user can never make a worker read ``/etc/passwd`` or another
  tenant's upload.

No torch here (``tests/test_layering.py``): the device a job runs on is the caller's choice
(the API plans ``auto`` as the CPU; the worker picks its own, ``worker.training``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from api_schemas import DatasetSpec, JobCreate
from api_schemas.engine_spec import ENGINE_CONFIG_VERSION, SpecError, engine_pointer, to_engine
from api_schemas.hf_model import HFConfigSource
from api_schemas.jobs import ModelSpec
from service.store import paths
from service.store.db.crud.uploads import DATASETS
from service.store.model_source import Uploaded, resolve_model_source
from service.store.settings import Settings

__all__ = [
    "SERVER_DATA_ROOT",
    "PrepareError",
    "PreparedJob",
    "Roots",
    "data_file",
    "is_prepared",
    "prepare_job",
    "resolve_dataset",
    "worker_engine_config",
]

SERVER_DATA_ROOT = "the server's data root"


class PrepareError(SpecError):
    """A spec field that does not resolve or translate: ``pointer`` into the submitted body,
    ``message`` (no server path in it) and ``code``, the API's 422 code for it
    (``not_found``, ``outside_root``, ``mismatch``, ``invalid``; ``unsupported`` for what
    the translation or the model-source check refuses)."""

    def __init__(self, pointer: str, message: str, code: str = "unsupported") -> None:
        super().__init__(pointer, message)
        self.code = code

    @classmethod
    def of(cls, err: SpecError) -> PrepareError:
        return err if isinstance(err, PrepareError) else cls(err.pointer, err.message)


@dataclass(frozen=True)
class Roots:
    """Where a job's root-relative references live: ``data`` (dataset paths, ``hf_dir``,
    tokenizers), ``artifacts`` with a ``session`` and the job's ``tenant_id`` (uploaded
    datasets and models; ``None`` for ``comera run``, which has no store), and how messages
    name the data root."""

    data: Path
    artifacts: Path | None = None
    session: Session | None = None
    tenant_id: str | None = None
    data_name: str = SERVER_DATA_ROOT

    @classmethod
    def server(cls, *, settings: Settings, session: Session, tenant_id: str) -> Roots:
        """The roots of a server process (the API's or a worker's) for a job of ``tenant_id``."""
        return cls(settings.data, settings.artifacts, session, tenant_id)

    @property
    def uploaded(self) -> Uploaded | None:
        if self.session is None or self.artifacts is None or self.tenant_id is None:
            return None
        return self.session, Path(self.artifacts), self.tenant_id


@dataclass(frozen=True)
class PreparedJob:
    """A job ready to plan, store and run: the spec and its versioned engine job dict."""

    spec: JobCreate
    engine_config: dict[str, Any]

    @property
    def dataset_pointer(self) -> str:
        """The spec's dataset reference (``/dataset/path``, ``/dataset/dataset_id``, ...)."""
        return engine_pointer("data.train", self.spec)


def data_file(root: Path, rel: str, pointer: str, name: str = SERVER_DATA_ROOT) -> str:
    """The resolved ``root / rel``: an existing file inside ``root`` (else PrepareError)."""
    base = Path(root).resolve()
    try:  # a component over NAME_MAX, a NUL byte, a symlink loop: the user's path, not a 500
        path = paths.resolve(base / rel)
        found = path.is_relative_to(base) and path.is_file()
    except (OSError, ValueError) as err:
        message = f"cannot read {rel[:200]!r}: {paths.reason(err)}"
        raise PrepareError(pointer, message, "invalid") from None
    if not path.is_relative_to(base):
        raise PrepareError(pointer, f"must stay under {name}", "outside_root")
    if not found:
        raise PrepareError(pointer, f"no file {rel!r} under {name}", "not_found")
    return str(path)


def resolve_dataset(spec: DatasetSpec, roots: Roots) -> tuple[str | None, str | None]:
    """``(train, valid)``: the resolved files of a dataset reference (``None`` for what is
    not a file); PrepareError naming the field."""
    if spec.source == "upload":
        if roots.session is None or roots.artifacts is None or roots.tenant_id is None:
            raise PrepareError(
                "/dataset/source",
                "uploaded datasets live on a server; use "
                f"'path' (relative to {roots.data_name}) or 'synthetic'",
            )
        row = DATASETS.get(
            session=roots.session, tenant_id=roots.tenant_id, upload_id=spec.dataset_id or ""
        )
        if row is None or row.state != "ready":
            raise PrepareError(
                "/dataset/dataset_id", f"no ready dataset {spec.dataset_id!r}", "not_found"
            )
        if row.format != spec.format:
            raise PrepareError(
                "/dataset/format",
                f"dataset {row.id} was uploaded as {row.format!r}, not {spec.format!r}",
                "mismatch",
            )
        name = "the artifact store"
        return data_file(roots.artifacts, row.path, "/dataset/dataset_id", name), None
    if spec.source == "path":
        train = data_file(roots.data, spec.path or "", "/dataset/path", roots.data_name)
        valid = spec.valid_path and data_file(
            roots.data, spec.valid_path, "/dataset/valid_path", roots.data_name
        )
        return train, valid or None
    return None, None


def _model_path(model: ModelSpec, roots: Roots) -> str | None:
    try:
        return resolve_model_source(data_root=roots.data, model=model, uploaded=roots.uploaded)
    except SpecError as err:
        raise PrepareError.of(err) from None


def prepare_job(spec: JobCreate, roots: Roots, *, device: str) -> PreparedJob:
    """Resolve ``spec``'s dataset and model source under ``roots`` and translate it for
    ``device`` (the API: ``cuda`` when the spec asks for it, else ``cpu``); PrepareError
    naming the field."""
    train, valid = resolve_dataset(spec.dataset, roots)
    model = _model_path(spec.model, roots)
    try:
        config = to_engine(
            spec, train_path=train, valid_path=valid, device=device, model_path=model
        )
    except SpecError as err:
        raise PrepareError.of(err) from None
    config.setdefault("version", ENGINE_CONFIG_VERSION)
    return PreparedJob(spec, config)


def is_prepared(engine_config: Mapping[str, Any] | None) -> bool:
    """Whether a stored ``engine_config`` is one this code prepared (its ``version``)."""
    return engine_config is not None and engine_config.get("version") == ENGINE_CONFIG_VERSION


def _model_key(model: ModelSpec) -> str | None:
    """The key of ``model.config`` that holds a root-relative model reference, if any."""
    source = model.source
    if model.arch not in ("hf_bert", "hf") or source is None or source.kind == "package":
        return None  # a package's pkg:<name>/model is resolved by the engine
    return "tokenizer" if isinstance(source, HFConfigSource) else "path"


def worker_engine_config(
    spec: Mapping[str, Any], stored: Mapping[str, Any] | None, roots: Roots
) -> tuple[dict[str, Any], bool]:
    """The engine job dict the worker runs and whether it was prepared here (no usable stored
    config). From the stored one (:func:`is_prepared`), only the root-relative references are
    resolved again under this worker's ``roots``: the dataset files and the model directory
    or tokenizer. Without one, the stored spec is prepared afresh (``device`` ``cpu``, or
    ``cuda`` when the spec asks for it: the worker sets its own)."""
    if not is_prepared(stored):
        body = JobCreate.model_validate(spec)
        device = "cuda" if body.training.device == "cuda" else "cpu"
        return prepare_job(body, roots, device=device).engine_config, True
    assert stored is not None
    config = copy.deepcopy(dict(stored))
    dataset = DatasetSpec.model_validate(spec["dataset"])
    if dataset.source != "synthetic":
        train, valid = resolve_dataset(dataset, roots)
        config["data"] = {**config["data"], "train": train, "valid": valid}
    model = ModelSpec.model_validate(spec["model"])
    key = _model_key(model)
    if key is not None:
        model_config = config["model"]["config"]
        config["model"] = {
            **config["model"],
            "config": {**model_config, key: _model_path(model, roots)},
        }
    return config, False

"""Model uploads: a Hugging Face directory (one tar, or multipart files), streamed to disk,
checked before anything is kept.

``POST /v1/models`` takes the directory as one tar (``Content-Type: application/x-tar``;
gzip also read). It is received as a dataset is (:func:`service.uploads.receive_to_file`:
a temporary file under ``<artifacts>/models/``, sha256 while streaming, 413 past
``max_model_upload_bytes`` or the tenant's model quota, 408 when idle, the tenant's upload
slots), then unpacked into a staging directory beside it, member by member:

* only regular files (and folders), at most :data:`MAX_FILES`, all at the top level or under
  one common folder (``llama/config.json``); a symlink, hard link or device, an absolute
  name, ``..``, or deeper nesting is refused with the member's name;
* pickles (``*.bin``, ``*.pt``, ``*.pth``, ``*.pkl``, ...) and code (``*.py``, ...) are refused
  by name, never read; other names must be plain (letters, digits, ``_ - .``) and end in
  :data:`ALLOWED_SUFFIXES`;
* the unpacked bytes count against the same limit (a compressed tar cannot expand past it).

Or as ``multipart/form-data``, one file part per file (:func:`receive_files`): the body is
parsed as it streams (the same size limit, idle timeout and at most :data:`MAX_FILES` parts,
no other fields), each part's file name a bare name checked as a tar member's, its bytes
copied into the staging directory and hashed.

Then the directory is checked as an ``hf`` job's would be (``service.store.model_source``:
``config.json`` bounds and family, the safetensors header's dtypes, shapes and byte ranges,
the tokenizer) before anything is kept. Only a directory that passed is renamed to
``models/<id>/`` and gets its row (``sha256``: of its files' names and sha256s). Every
refusal is a 4xx; the staging directory and the temporary tar are removed.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import AsyncGenerator
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Any

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from api_schemas.engine_spec import SpecError
from service.errors import FieldProblem
from service.middleware import content_length_exceeds
from service.store.db.models import UploadedModel
from service.store.ids import new_id
from service.store.model_source import PICKLED, REQUIRED_FILES, check_model_dir
from service.store.settings import Settings
from service.upload_limits import idle_stream, over_quota, quota_left
from service.uploads import receive_to_file, record_upload, too_large, upload_slots

__all__ = ["ALLOWED_SUFFIXES", "MAX_FILES", "MODELS_DIR", "receive_files", "store_model_upload"]

MODELS_DIR = "models"
MAX_FILES = 64
CODE = (".py", ".pyc", ".pyo", ".so", ".sh", ".ipynb")
REFUSED = tuple(PICKLED) + (".pkl", ".pickle", ".joblib", ".npy", ".npz") + CODE
ALLOWED_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".md")
CHUNK = 1 << 20
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")  # config.json, model.safetensors, ...


class Refused(ValueError):
    """A tar member, or the directory, that is not taken (the message names it)."""


def _refuse(message: str) -> FieldProblem:
    return FieldProblem.one("", message, "format")


def _name(member: tarfile.TarInfo) -> tuple[str | None, str]:
    """(its folder or None, its file name) of a member, or :class:`Refused`."""
    shown = member.name[:200]
    path = PurePosixPath(member.name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if path.is_absolute() or ".." in parts:
        raise Refused(f"{shown!r}: a name outside the model directory (absolute or '..')")
    if not (member.isfile() or member.isdir()):
        kind = "symlink" if member.issym() else "hard link" if member.islnk() else "special file"
        raise Refused(f"{shown!r} is a {kind}; a model upload holds regular files only")
    if len(parts) > 2 or (member.isdir() and len(parts) > 1):
        raise Refused(f"{shown!r}: files go at the top level or under one folder")
    return (parts[0] if len(parts) == 2 else None), (parts[-1] if parts else "")


def check_file_name(name: str) -> None:
    """Pickles and code are refused by name; other names must be plain (:data:`NAME`) and
    have a known suffix."""
    if not NAME.fullmatch(name):
        raise Refused(f"{name[:200]!r}: a file name of letters, digits, '_', '-' and '.'")
    lower = name.lower()
    if lower.endswith(REFUSED):
        what = "code" if lower.endswith(CODE) else "pickled data"
        raise Refused(
            f"{name!r} is {what}, which is never accepted (weights in model.safetensors, "
            "the model's code is transformers' own)"
        )
    if not lower.endswith(ALLOWED_SUFFIXES):
        raise Refused(f"{name!r}: a model directory holds only {list(ALLOWED_SUFFIXES)} files")


def _copy(src: IO[bytes], dest: Path, budget: int) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with dest.open("xb") as out:
        while chunk := src.read(CHUNK):
            size += len(chunk)
            if size > budget:
                raise HTTPException(413, "The unpacked model exceeds the upload limit.")
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def unpack(tar_path: Path, stage: Path, limit: int) -> dict[str, dict[str, Any]]:
    """The tar's files written into ``stage`` (module doc): ``{name: {size_bytes, sha256}}``."""
    files: dict[str, dict[str, Any]] = {}
    folders: set[str | None] = set()
    try:
        with tarfile.open(tar_path, mode="r:*") as tar:
            for i, member in enumerate(tar):
                if i >= 2 * MAX_FILES:
                    raise Refused(f"the tar holds more than {MAX_FILES} files")
                folder, name = _name(member)
                if member.isdir():
                    continue
                folders.add(folder)
                if len(folders) > 1:
                    raise Refused("the files are under more than one folder")
                check_file_name(name)
                if name in files:
                    raise Refused(f"{name!r} appears twice")
                src = tar.extractfile(member)
                assert src is not None  # a regular file
                used = sum(f["size_bytes"] for f in files.values())
                size, sha = _copy(src, stage / name, limit - used)
                files[name] = {"size_bytes": size, "sha256": sha}
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as err:
        raise Refused(f"not a readable tar ({type(err).__name__}: {str(err)[:200]})") from None
    return files


async def _limited(request: Request, limit: int, idle: float) -> AsyncGenerator[bytes, None]:
    size = 0
    async for chunk in idle_stream(request, idle):
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        yield chunk


async def receive_files(
    request: Request, stage: Path, limit: int, idle: float
) -> dict[str, dict[str, Any]]:
    """A ``multipart/form-data`` body's files written into ``stage`` (module doc)."""
    if content_length_exceeds(request.headers.get("content-length", ""), limit):
        raise too_large(limit)
    parser = MultiPartParser(
        request.headers, _limited(request, limit, idle), max_files=MAX_FILES, max_fields=0
    )
    try:
        form = await parser.parse()
    except MultiPartException as err:
        raise Refused(f"not a readable multipart body ({err.message})") from None
    files: dict[str, dict[str, Any]] = {}
    try:
        for field, value in form.multi_items():
            if not isinstance(value, UploadFile):
                raise Refused(f"field {field[:64]!r} is not a file")
            name = value.filename or ""
            if not name or "/" in name or "\\" in name or name in (".", ".."):
                raise Refused(f"{name[:200]!r}: a part's file name is a bare file name")
            check_file_name(name)
            if name in files:
                raise Refused(f"{name!r} appears twice")
            budget = limit - sum(f["size_bytes"] for f in files.values())
            size, sha = await run_in_threadpool(_copy, value.file, stage / name, budget)
            files[name] = {"size_bytes": size, "sha256": sha}
    finally:
        await form.close()
    return files


def _checked(stage: Path, name: str, files: dict[str, dict[str, Any]]) -> str:
    """The model_type of the staged directory after the ``hf`` checks (``Refused``)."""
    if missing := [f for f in REQUIRED_FILES if f not in files]:
        raise Refused(
            f"the upload lacks {missing} (a model directory holds {list(REQUIRED_FILES)})"
        )
    try:
        check_model_dir(stage, root=stage, pointer="", shown=name, arch="hf")
    except SpecError as err:
        raise Refused(err.message) from None
    return str(json.loads((stage / "config.json").read_bytes())["model_type"])


def _digest(files: dict[str, dict[str, Any]]) -> str:
    lines = "".join(f"{n} {files[n]['sha256']}\n" for n in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


async def store_model_upload(
    *, request: Request, session: Session, settings: Settings, tenant_id: str, name: str
) -> UploadedModel:
    """Receive, unpack, check and keep one model; every refusal leaves nothing behind."""
    with upload_slots(request, settings).hold(tenant_id):
        return await _store(request, session, settings, tenant_id, name)


async def _store(
    request: Request, session: Session, settings: Settings, tenant_id: str, name: str
) -> UploadedModel:
    folder = Path(settings.artifacts) / MODELS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    quota = settings.max_model_bytes_per_tenant
    left = await run_in_threadpool(quota_left, session, tenant_id, quota, UploadedModel)
    limit = min(settings.max_model_upload_bytes, left)
    idle = settings.upload_idle_seconds
    multipart = request.headers.get("content-type", "").lower().startswith("multipart/")
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=".stage-"))
    tmp: Path | None = None
    try:
        try:
            if multipart:
                files = await receive_files(request, stage, limit, idle)
            else:
                tmp, _, _ = await receive_to_file(request, folder, limit, idle)
                files = await run_in_threadpool(unpack, tmp, stage, limit)
            model_type = await run_in_threadpool(_checked, stage, name, files)
        except Refused as err:
            raise _refuse(str(err)) from None
        except HTTPException as err:
            if err.status_code == 413 and limit < settings.max_model_upload_bytes:
                raise over_quota(quota, quota - left, "models") from None
            raise
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        model_id = new_id("mdl")
        final = folder / model_id
        os.replace(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    size = sum(f["size_bytes"] for f in files.values())
    row = UploadedModel(
        id=model_id,
        tenant_id=tenant_id,
        name=name,
        model_type=model_type,
        path=f"{MODELS_DIR}/{model_id}",
        size_bytes=size,
        sha256=_digest(files),
        files=files,
    )
    discard = partial(shutil.rmtree, final, ignore_errors=True)
    return await record_upload(session=session, row=row, quota=quota, discard=discard)

"""Why a job failed, as the RFC 9457 problem object stored in ``jobs.error``.

Failure classes (docs/service.md#failure-classes); the class is also the attempt's ``exit_reason``:

==============  ======  =========  ===============================================
class           status  retryable  raised by
==============  ======  =========  ===============================================
``validation``  422     no         SpecError, engine ConfigError, a stored spec that no
                                   longer validates, a step that ``training.cuda_graph``
                                   ``on`` cannot capture (``errors`` names the field)
``data_error``  422     no         engine DataError (a malformed row: file and line)
``nan_loss``    500     no         a non-finite training loss
``oom``         507     no         ``torch.cuda.OutOfMemoryError``, ``MemoryError``
                                   (numpy's too), a failed torch CPU allocation
                                   (a ``RuntimeError`` from ``DefaultCPUAllocator``)
``timeout``     504     no         the wall-time limit (``limits.max_wall_time_s``)
``storage``     507     yes        a file could not be written (disk full, file size limit,
                                   read-only or failing disk): ``OSError`` with such an
                                   errno, or the same error from safetensors' writer
``error``       500     yes        anything else (the message only; the traceback is logged)
``preempted``   503     yes        the worker was told to stop (SIGTERM): written by the
                                   pipeline once no attempts are left (else it requeues)
``worker_lost`` 503     yes        the lease expired: written by the reaper
                                   (``service.store.reaper``) once no attempts are left
==============  ======  =========  ===============================================

``worker_lost`` and ``preempted`` attempts are retried automatically (attempt n+1, resuming
from the newest complete checkpoint) while attempts are left; the other classes end the job
(``retryable`` says whether ``POST /v1/jobs/{id}/retry`` may help).

Types are ``https://comera.dev/problems/<class>``. Every problem carries ``retryable`` and,
when known, the ``stage`` and ``step`` where the job stopped. Server paths (the data root,
the artifact directory) are cut out of ``detail`` and of every ``errors[].message``.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from api_schemas.engine_spec import Spec, SpecError, engine_pointer
from worker.callback import NanLoss

__all__ = ["PROBLEM_BASE", "JobTimeout", "Preempted", "problem_for"]

PROBLEM_BASE = "https://comera.dev/problems/"
TITLES = {
    "validation": ("The job spec cannot run on this engine", 422, False),
    "data_error": ("The dataset could not be read", 422, False),
    "nan_loss": ("Training diverged (non-finite loss)", 500, False),
    "oom": ("Out of memory", 507, False),
    "timeout": ("The job ran past its wall-time limit", 504, False),
    "storage": ("A file could not be written (storage error)", 507, True),
    "error": ("The job failed", 500, True),
    "preempted": ("The worker was stopped (preempted)", 503, True),
    "worker_lost": ("The worker running the job was lost", 503, True),
}
# errnos of a store that cannot take a write: EIO, ENOSPC, EROFS, EFBIG, EDQUOT
STORAGE_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EDQUOT})
OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust writers (safetensors) report errno
# torch's CPU allocator reports a failed allocation as a plain RuntimeError (not
# OutOfMemoryError): "[enforce fail at alloc_cpu.cpp:..] ... DefaultCPUAllocator: can't
# allocate memory: you tried to allocate N bytes" ("not enough memory" in older versions)
CPU_ALLOC_FAILED = re.compile(r"DefaultCPUAllocator: (?:can't allocate|not enough) memory")


class JobTimeout(Exception):
    """The cooperative wall-time stop (before Celery's soft limit)."""


class Preempted(Exception):
    """The worker was told to stop (SIGTERM) and the job has no attempts left."""


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # never import torch just to classify an error
    return (
        isinstance(exc, MemoryError)
        or (torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError))
        or (isinstance(exc, RuntimeError) and CPU_ALLOC_FAILED.search(str(exc)) is not None)
    )


def _storage_errno(exc: BaseException) -> int | None:
    """The errno of a failed write to a store that cannot take it, else None."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and (m := OS_ERROR.search(str(exc))):
        code = int(m[1])
    return code if code in STORAGE_ERRNOS else None


def _raised_in(exc: BaseException, function: str) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False


def _classify(
    exc: BaseException, spec: Spec = None
) -> tuple[str, str, list[dict[str, str]] | None]:
    """(class, detail, field errors); ``spec``: the job's submitted spec, which names the wire
    field of an engine error (:func:`api_schemas.engine_spec.engine_pointer`)."""
    if isinstance(exc, SpecError):
        errors = [{"pointer": exc.pointer, "message": exc.message, "code": "spec"}]
        return "validation", str(exc), errors
    if isinstance(exc, ValidationError):
        errors = [
            {
                "pointer": "/" + "/".join(str(p) for p in e["loc"]),
                "message": e["msg"],
                "code": e["type"],
            }
            for e in exc.errors()
        ]
        return "validation", "the stored spec no longer validates", errors
    if isinstance(exc, NanLoss):
        return "nan_loss", str(exc), None
    if isinstance(exc, JobTimeout):
        return "timeout", str(exc), None
    if isinstance(exc, Preempted):
        return "preempted", str(exc), None
    if isinstance(exc, SoftTimeLimitExceeded):
        return "timeout", "interrupted at the wall-time limit (limits.max_wall_time_s)", None
    if _is_oom(exc):
        return "oom", str(exc) or type(exc).__name__, None
    if (code := _storage_errno(exc)) is not None:
        what = "a checkpoint" if _raised_in(exc, "save_checkpoint") else "a file"
        name = errno.errorcode.get(code, str(code))
        return "storage", f"writing {what} failed: {os.strerror(code)} ({name})", None
    engine_train, engine_data = sys.modules.get("engine.train"), sys.modules.get("engine.data")
    if engine_train is not None and isinstance(exc, engine_train.ConfigError):
        message = str(exc).removeprefix(f"{exc.field}:").strip()
        errors = [
            {"pointer": engine_pointer(exc.field, spec), "message": message, "code": "config"}
        ]
        return "validation", f"{exc.field}: {message}", errors
    graphs = sys.modules.get("engine.train.cuda_graphs")
    if graphs is not None and isinstance(exc, graphs.CudaGraphUnavailableError):
        # training.cuda_graph "on" and the step cannot be captured: the spec's choice
        errors = [{"pointer": "/training/cuda_graph", "message": str(exc), "code": "config"}]
        return "validation", f"training.cuda_graph: {exc}", errors
    if engine_data is not None and isinstance(exc, engine_data.DataError):
        return "data_error", str(exc), None
    return "error", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, None


def _without_roots(text: str, roots: tuple[Path, ...]) -> str:
    """``text`` with the server paths ``roots`` cut out (the resolved form first)."""
    for root in roots:
        text = text.replace(f"{Path(root).resolve()}/", "").replace(f"{root}/", "")
    return text


def problem_for(
    exc: BaseException,
    *,
    step: int | None = None,
    stage: str | None = None,
    roots: tuple[Path, ...] = (),
    spec: Spec = None,
) -> tuple[str, dict[str, Any]]:
    """``(failure class, problem dict)`` for an exception that ended a job; ``spec``: the
    job's submitted spec (its stored JSON), so an engine error points at the field the planner
    would have named."""
    kind, detail, errors = _classify(exc, spec)
    detail = _without_roots(detail, roots)
    for error in errors or ():
        error["message"] = _without_roots(error["message"], roots)
    title, status, retryable = TITLES[kind]
    out: dict[str, Any] = {
        "type": PROBLEM_BASE + kind,
        "title": title,
        "status": status,
        "detail": detail,
        "retryable": retryable,
        "stage": stage,
        "step": step,
    }
    if errors:
        out["errors"] = errors
    return kind, out

"""The dry-run planner: ``worker.plan.plan_job`` in a separate, spawned process.

Planning builds the model (torch), and the API process must never import torch (the API
image is CPU-only and small; tests/service/test_import.py checks it). So one long-lived child,
started with the ``spawn`` context (no fork of a process with threads and sockets), imports
``worker.plan`` by name and answers plan requests. The child is shared by every app in the
process and started on first use; a request waits at most ``timeout_s``, after which the child
is killed and replaced. A child that dies (a signal to the process group) is not restarted
behind the API's back: the next request starts a fresh one. The child exits when the API
process does, however that ends. When the worker package is not installed, or the child fails, the
planner is *unavailable*: job submission then accepts the job and lets the worker validate it,
and the dry run answers 503.

Engine errors name their field as a dotted path of the engine config
(``schedule[1].target_ratio``); :func:`engine_field_to_pointer` turns it into a JSON Pointer
into the submitted body (``/schedule/1/target_ratio``), renaming the sections whose wire
names differ (``data`` -> ``dataset``, ``checkpoint.every_steps`` ->
``checkpointing/every_n_steps``, ...).
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from service.errors import json_pointer

__all__ = ["PlanFailed", "Planner", "PlannerUnavailable", "default_planner",
           "engine_field_to_pointer"]  # fmt: skip

PLAN_TIMEOUT_S = 60.0
_SECTIONS = {"data": "dataset", "checkpoint": "checkpointing"}
_RENAMES = {  # (wire section, engine field) -> wire field
    ("dataset", "train"): "path", ("dataset", "valid"): "valid_path",
    ("dataset", "kind"): "format", ("checkpointing", "every_steps"): "every_n_steps",
    ("compression", "shapes"): "modes",
}  # fmt: skip


class PlannerUnavailable(RuntimeError):
    """No plan could be made (no worker package, a crash or a timeout): not the user's fault."""


class PlanFailed(ValueError):
    """The engine refused the job: ``pointer`` names the field of the submitted body."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.pointer, self.message = pointer, message


def engine_field_to_pointer(field: str | None) -> str:
    """``schedule[1].target_ratio`` -> ``/schedule/1/target_ratio``; ``data.train`` ->
    ``/dataset/path``; unknown or empty -> ``""`` (the whole body)."""
    parts: list[str | int] = [int(p) if p.isdigit() else p
                              for p in re.findall(r"[^.\[\]]+", field or "")]  # fmt: skip
    if not parts or parts[0] in ("version", "galore"):
        return ""
    if parts == ["method"]:
        return "/compression/method"
    section = _SECTIONS.get(str(parts[0]), str(parts[0]))
    parts[0] = section
    if len(parts) > 1:
        parts[1] = _RENAMES.get((section, str(parts[1])), parts[1])
    return json_pointer(parts)


def _exit_with_parent() -> None:
    """Child initializer: the child exits as soon as the API process is gone (however it
    ends: a SIGKILL runs no clean-up), instead of living on as an orphan."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent's sentinel closes: the parent has exited
        os._exit(0)

    threading.Thread(target=watch, name="planner-parent-watch", daemon=True).start()


def _plan_in_child(job: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child: never raises (exceptions do not always survive pickling)."""
    try:
        module = importlib.import_module("worker.plan")
    except ImportError as err:
        return {"status": "unavailable", "message": f"worker.plan cannot be imported: {err}"}
    try:
        return {"status": "ok", "plan": module.plan_job(job)}
    except ValueError as err:  # engine ConfigError (has .field) or a plain ValueError
        field = getattr(err, "field", None)
        message = str(err)
        if field and message.startswith(f"{field}: "):
            message = message[len(field) + 2 :]
        return {"status": "invalid", "field": field, "message": message}
    except Exception as err:  # noqa: BLE001 (a planner bug must not fail the submission)
        return {"status": "unavailable", "message": f"planner error: {err!r}"}


class Planner:
    """A one-process spawned executor running :func:`_plan_in_child`; thread-safe."""

    def __init__(self, timeout_s: float = PLAN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1,
                                                 mp_context=mp.get_context("spawn"),
                                                 initializer=_exit_with_parent)  # fmt: skip
            return self._pool

    def close(self) -> None:
        """Stop the child now (killed: it may be stuck in a plan); never waits on it long."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        children = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for child in children:
            child.kill()
            child.join(5)

    def plan(self, job: dict[str, Any]) -> dict[str, Any]:
        """The plan of an engine job dict; raises ``PlanFailed`` or ``PlannerUnavailable``."""
        try:
            try:
                out = self._get_pool().submit(_plan_in_child, job).result(self.timeout_s)
            except BrokenProcessPool:  # the child died since the last request: a fresh one
                self.close()
                out = self._get_pool().submit(_plan_in_child, job).result(self.timeout_s)
        except FutureTimeout:
            self.close()  # the child may be stuck: start a fresh one next time
            raise PlannerUnavailable(f"planning took longer than {self.timeout_s:g} s") from None
        except Exception as err:  # noqa: BLE001 (start-up failure, a child that died)
            self.close()
            raise PlannerUnavailable(f"the planner failed: {err!r}") from None
        if out["status"] == "invalid":
            raise PlanFailed(engine_field_to_pointer(out["field"]), out["message"])
        if out["status"] != "ok":
            raise PlannerUnavailable(out["message"])
        return out["plan"]


_default: Planner | None = None
_default_lock = threading.Lock()


def default_planner() -> Planner:
    """The process-wide planner (one child for every app in this process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Planner()
            atexit.register(_default.close)
        return _default

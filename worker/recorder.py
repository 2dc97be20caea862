"""Batched writes of a running job: metric and rank points, events, progress, compression.

The trainer emits many small events; writing each one would make the database the
bottleneck. The :class:`Recorder` buffers them and flushes every ``flush_seconds`` or
``flush_points`` points (docs/service.md#progress-and-series), at stage ends and at the end,
each flush in ONE transaction:

* ``metric_points`` / ``rank_points``: upserts on their unique keys ``(job, key, step)`` /
  ``(job, tensor, step)`` (``INSERT … ON CONFLICT DO UPDATE`` on PostgreSQL and SQLite), so a
  resumed attempt that replays steps overwrites its points instead of duplicating them; the
  buffer itself keeps the last value per key and step (one row per key in a statement);
* ``job_latest_metrics``: the newest value of every key written in the batch;
* ``jobs.progress`` and ``jobs.compression`` when they changed (only while the job is still on
  this attempt: a worker that lost its lease never overwrites its successor's progress);
* ``job_events``: the buffered events in order, then one ``metric`` event with the newest
  value of each key written in the batch;
* extra rows (checkpoints) and an optional callback, in the same transaction.

Every row written carries the job's tenant (``tenant_id``, given by the pipeline from the job
row it claimed). Values that are not finite (NaN, inf) are never written: JSON has no form for
them and SQLite stores NaN as NULL. The recorder knows no torch and no Celery.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.store.db.crud.jobs import append_event
from service.store.db.crud.points import set_attempt_summary, write_points
from service.store.db.models import utcnow
from service.store.db.session import session_scope

__all__ = ["Recorder", "finite", "json_clean"]


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def json_clean(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats become ``None`` (PostgreSQL JSONB rejects NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_clean(v) for v in value]
    return value


class Recorder:
    """Buffers one attempt's points and events and writes them in batches (see module doc)."""

    def __init__(
        self,
        *,
        factory: sessionmaker[Session],
        job_id: str,
        tenant_id: str,
        attempt: int,
        flush_seconds: float,
        flush_points: int,
    ) -> None:
        self.factory, self.job_id, self.attempt = factory, job_id, attempt
        self.tenant_id = tenant_id
        self.flush_seconds, self.flush_points = flush_seconds, flush_points
        self._metrics: dict[tuple[str, int], dict[str, Any]] = {}
        self._ranks: dict[tuple[str, int], dict[str, Any]] = {}
        self._events: list[tuple[str, dict[str, Any], datetime]] = []
        self._rows: list[Any] = []
        self._job_values: dict[str, Any] = {}  # progress / compression to write
        self._last_flush = time.monotonic()
        self.latest: dict[str, float] = {}  # newest value of every key seen (any batch)
        self.progress: dict[str, Any] = {"step": 0}
        self.compression: dict[str, Any] = {}
        self.flushes = 0

    # -- buffering --------------------------------------------------------------------------
    def metric(
        self,
        key: str,
        step: int,
        value: Any,
        *,
        stage: str | None = None,
        epoch: float | None = None,
    ) -> None:
        """One metric point; a non-finite value is dropped."""
        if not finite(value):
            return
        self._metrics[(key, step)] = {
            "job_id": self.job_id,
            "tenant_id": self.tenant_id,
            "attempt": self.attempt,
            "key": key,
            "step": step,
            "stage": stage,
            "epoch": epoch,
            "value": float(value),
            "t": utcnow(),
        }
        self.latest[key] = float(value)

    def rank(
        self,
        tensor: str,
        step: int,
        *,
        stage: str | None,
        kind: str,
        ranks: list[int],
        params: int,
        dense: int,
        ratio: float,
    ) -> None:
        self._ranks[(tensor, step)] = {
            "job_id": self.job_id,
            "tenant_id": self.tenant_id,
            "attempt": self.attempt,
            "tensor": tensor,
            "step": step,
            "stage": stage,
            "kind": kind,
            "ranks": list(ranks),
            "params": params,
            "dense": dense,
            "ratio": ratio,
            "t": utcnow(),
        }

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self._events.append((kind, json_clean(data), utcnow()))

    def row(self, row: Any) -> None:
        """An ORM object to add in the next flush (a checkpoint)."""
        self._rows.append(row)

    def set_progress(self, **values: Any) -> None:
        new = {**self.progress, **values}
        if new != self.progress:
            self.progress = new
            self._job_values["progress"] = dict(new)

    def set_compression(self, **values: Any) -> None:
        new = json_clean({**self.compression, **values})
        if new != self.compression:
            self.compression = new
            self._job_values["compression"] = dict(new)

    def pending(self) -> int:
        return len(self._metrics) + len(self._ranks) + len(self._events) + len(self._rows)

    # -- writing ----------------------------------------------------------------------------
    def maybe_flush(self) -> None:
        """Flush when ``flush_points`` are buffered or ``flush_seconds`` have passed."""
        if self.pending() >= self.flush_points or (
            (self.pending() or self._job_values)
            and time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    def flush(self, extra: Callable[[Session], None] | None = None) -> None:
        """Write everything buffered in one transaction (plus ``extra(session)``), then clear
        the buffers; on an error nothing is cleared, so the next flush retries the batch."""
        self._last_flush = time.monotonic()
        if not (self.pending() or self._job_values or extra):
            return
        metrics, ranks = list(self._metrics.values()), list(self._ranks.values())
        with session_scope(self.factory) as s:
            newest: dict[str, dict[str, Any]] = {}
            for p in metrics:  # newest step per key in this batch
                if p["key"] not in newest or p["step"] >= newest[p["key"]]["step"]:
                    newest[p["key"]] = p
            latest = [
                {
                    "job_id": self.job_id,
                    "tenant_id": self.tenant_id,
                    "key": k,
                    "step": p["step"],
                    "value": p["value"],
                    "t": p["t"],
                }
                for k, p in newest.items()
            ]
            write_points(session=s, metrics=metrics, ranks=ranks, latest=latest)
            if self._job_values:  # only while the job is still on our attempt
                set_attempt_summary(
                    session=s, job_id=self.job_id, attempt=self.attempt, values=self._job_values
                )
            s.add_all(self._rows)
            s.flush()
            for kind, data, t in self._events:
                append_event(
                    session=s, job_id=self.job_id, attempt=self.attempt, kind=kind, data=data, t=t
                )
            if newest:
                step = max(p["step"] for p in newest.values())
                append_event(
                    session=s,
                    job_id=self.job_id,
                    attempt=self.attempt,
                    kind="metric",
                    data={
                        "step": step,
                        "values": {k: p["value"] for k, p in sorted(newest.items())},
                    },
                )
            if extra is not None:
                extra(s)
        self._metrics.clear()
        self._ranks.clear()
        self._events.clear()
        self._rows.clear()
        self._job_values.clear()
        self.flushes += 1

"""The registered workers and what they can run: placements the API can refuse at submission.

A job goes to the queue of its placement (``service.store.placement``) and only a worker
consuming that queue ever takes it. Each Celery worker writes a row (``models.Worker``: its
node name and the job queues it consumes) when it starts and refreshes ``seen_at`` every
``COMERA_HEARTBEAT_SECONDS`` while it runs (``worker.registration``); a row not seen for
``COMERA_WORKER_TTL_SECONDS`` no longer counts. At submission :func:`capacity` compares the
job's queue with the queues of the workers that count:

* one of them consumes it: the job is queued as usual;
* workers count, none consumes it: the job could only wait forever, so the API answers 422
  naming ``/training/nodes`` (no worker serves that many nodes) or ``/training/devices``;
* no worker counts at all (the service has just started, or every worker is down): the job is
  accepted, and its message says ``waiting_for_capacity`` with the reason.

When a worker registers, the jobs ``waiting_for_capacity`` on the queues it consumes get their
``queued`` message back (:func:`register_worker`).

A worker also writes the memory baseline it measured for a job's process on its host
(``worker.process_baseline``: ``process_bytes``, ``hf_bytes``, ``launcher_bytes``); the API's
planner counts the largest of the workers that count (:func:`process_baseline`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.models import Job, Worker, utcnow
from service.store.placement import parse_queue, placement, queue_name
from service.store.settings import Settings

__all__ = [
    "BASELINE_FIELDS",
    "WAITING",
    "Capacity",
    "capacity",
    "process_baseline",
    "register_worker",
    "served_queues",
]

WAITING = "waiting_for_capacity"
BASELINE_FIELDS = ("process_bytes", "hf_bytes", "launcher_bytes")


@dataclass(frozen=True)
class Capacity:
    """The verdict on one placement: ``refused`` is ``(pointer, message)`` for a 422;
    ``waiting`` the job's message when no worker has reported; both None: a worker serves it."""

    queue: str
    refused: tuple[str, str] | None = None
    waiting: str | None = None


def served_queues(*, session: Session, settings: Settings, now: datetime | None = None) -> set[str]:
    """The job queues (of ``settings.queue``) consumed by workers seen within the TTL."""
    since = (now or utcnow()) - timedelta(seconds=settings.worker_ttl_seconds)
    rows = session.scalars(select(Worker.queues).where(Worker.seen_at >= since))
    return {q for queues in rows for q in queues if parse_queue(settings.queue, q) is not None}


def _describe(placements: set[tuple[int, int]]) -> str:
    parts = [
        f"devices {d}" if n == 1 else f"nodes {n} x devices {d}" for d, n in sorted(placements)
    ]
    return ", ".join(parts)


def capacity(
    *, session: Session, settings: Settings, devices: int, nodes: int, now: datetime | None = None
) -> Capacity:
    """Whether a registered worker can run a job of ``devices`` per node on ``nodes`` (module
    doc)."""
    queue = queue_name(settings.queue, devices=devices, nodes=nodes)
    served = served_queues(session=session, settings=settings, now=now)
    if queue in served:
        return Capacity(queue)
    command = f"comera worker --devices {devices}" + (f" --nodes {nodes}" if nodes > 1 else "")
    if not served:
        ttl = f"{settings.worker_ttl_seconds:g}"
        return Capacity(
            queue,
            waiting=(
                f"{WAITING}: no worker has reported in the last {ttl} s; the job waits on "
                f"queue {queue} for a worker that consumes it (`{command}`)"
            ),
        )
    placements = {p for q in served if (p := parse_queue(settings.queue, q)) is not None}
    field = "/training/nodes" if nodes not in {n for _, n in placements} else "/training/devices"
    message = (
        f"no registered worker runs jobs of training.devices {devices} on training.nodes "
        f"{nodes} (queue {queue}); the registered workers run {_describe(placements)}. "
        f"An operator can start `{command}` on a machine with {devices} devices"
    )
    return Capacity(queue, refused=(field, message))


def register_worker(
    *,
    session: Session,
    settings: Settings,
    name: str,
    queues: list[str],
    now: datetime | None = None,
    baseline: Mapping[str, int] | None = None,
) -> int:
    """Write or refresh the row of worker ``name`` consuming ``queues`` (commits), with the
    ``baseline`` it measured when it has (:data:`BASELINE_FIELDS`), and give the jobs
    ``waiting_for_capacity`` on those queues their ``queued`` message back; returns how many.
    A worker consuming no job queue of ``settings.queue`` writes nothing."""
    jobs_queues = sorted(q for q in queues if parse_queue(settings.queue, q) is not None)
    if not jobs_queues:
        return 0
    now = now or utcnow()
    values: dict[str, Any] = {"queues": jobs_queues, "seen_at": now}
    if baseline is not None:
        values.update({k: int(baseline[k]) for k in BASELINE_FIELDS})
    if not session.execute(update(Worker).where(Worker.name == name).values(**values)).rowcount:
        session.add(Worker(name=name, started_at=now, **values))
        try:
            session.flush()
        except IntegrityError:  # written meanwhile by a namesake: refresh that row
            session.rollback()
            session.execute(update(Worker).where(Worker.name == name).values(**values))
    released = _release_waiting(session=session, settings=settings, queues=set(jobs_queues))
    session.commit()
    return released


def process_baseline(
    *, session: Session, settings: Settings, now: datetime | None = None
) -> dict[str, int] | None:
    """The largest of each baseline figure among the workers seen within the TTL that have
    measured theirs; None when none has."""
    since = (now or utcnow()) - timedelta(seconds=settings.worker_ttl_seconds)
    columns = [func.max(getattr(Worker, k)) for k in BASELINE_FIELDS]
    row = session.execute(
        select(*columns).where(Worker.seen_at >= since, Worker.process_bytes.is_not(None))
    ).one()
    if row[0] is None:
        return None
    return {k: int(v or 0) for k, v in zip(BASELINE_FIELDS, row, strict=True)}


def _release_waiting(*, session: Session, settings: Settings, queues: set[str]) -> int:
    waiting = session.execute(
        select(Job.id, Job.spec).where(
            Job.state == JobState.QUEUED.value, Job.message.startswith(WAITING)
        )
    ).all()
    ids = [
        job_id
        for job_id, spec in waiting
        if queue_name(settings.queue, **placement(spec)) in queues
    ]
    if not ids:
        return 0
    q = (
        update(Job)
        .where(Job.id.in_(ids), Job.state == JobState.QUEUED.value, Job.message.startswith(WAITING))
        .values(message="queued")
    )
    return session.execute(q).rowcount

"""Server-sent events of a job (``Accept: text/event-stream``), polling the database.

The stream first sends every stored event after the resume point (``Last-Event-ID`` or
``after``), then polls the ``job_events`` table every ``POLL_S`` seconds for new ones. Each
event goes out with ``id: <seq>`` (so a reconnecting client resumes exactly), ``event: <kind>``
and the ``EventPublic`` JSON as data; a comment keeps idle connections open every
``PING_S`` seconds. The stream ends after a terminal ``state`` event, or when the job is
finished (or gone) and nothing newer is left to send.

Polling SQL instead of tailing Redis (docs/service.md#events) keeps one source of truth and
no extra server; the cost is one small indexed query per open stream per half second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from sqlalchemy.orm import Session

from api_schemas import TERMINAL_STATES
from service.store.db.crud.jobs import get_job
from service.store.db.crud.series import events_after
from service.views import event_public

__all__ = ["PING_S", "POLL_S", "event_stream", "wants_event_stream"]

POLL_S = 0.5
PING_S = 15
BATCH = 500
TERMINAL = {s.value for s in TERMINAL_STATES}
JSON_TYPES = ("application/json", "application/*", "*/*")


def wants_event_stream(accept: str | None) -> bool | None:
    """True: SSE; False: a JSON page; None: neither is acceptable (406)."""
    if not accept or not accept.strip():
        return False
    ranges = []
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        q = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            if float(q) > 0:
                ranges.append(kind.lower())
        except ValueError:
            ranges.append(kind.lower())
    if "text/event-stream" in ranges:
        return True
    return False if any(r in JSON_TYPES for r in ranges) else None


def _poll(
    sessions: Callable[[], Session],
    tenant_id: str,
    job_id: str,
    after: int,
    kinds: Sequence[str] | None,
) -> tuple[list[dict[str, Any]], bool]:
    """(new events as SSE dicts, whether the job is finished or gone)."""
    with sessions() as session:  # the state first: a terminal state's event is then visible
        job = get_job(session=session, job_id=job_id, tenant_id=tenant_id)
        done = job is None or job.state in TERMINAL
        events = events_after(
            session=session,
            tenant_id=tenant_id,
            job_id=job_id,
            after=after,
            limit=BATCH,
            kinds=kinds,
        )
        out = [
            {
                "seq": e.seq,
                "kind": e.kind,
                "terminal": e.kind == "state" and e.data.get("state") in TERMINAL,
                "json": event_public(e).model_dump_json(),
            }
            for e in events
        ]
    return out, done


async def event_stream(
    sessions: Callable[[], Session],
    tenant_id: str,
    job_id: str,
    after: int,
    kinds: Sequence[str] | None = None,
    poll_s: float = POLL_S,
) -> AsyncIterator[dict[str, str]]:
    """The SSE messages (``id``, ``event``, ``data``) of one job from ``after`` on."""
    last = after
    while True:
        events, done = await anyio.to_thread.run_sync(
            _poll, sessions, tenant_id, job_id, last, kinds
        )
        for e in events:
            last = e["seq"]
            yield {"id": str(e["seq"]), "event": e["kind"], "data": e["json"]}
            if e["terminal"]:
                return
        if len(events) < BATCH and done:
            return
        if len(events) < BATCH:
            await anyio.sleep(poll_s)

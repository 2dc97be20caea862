"""``ComeraClient``: the service's HTTP API as Python methods returning ``api_schemas`` models.

::

    with ComeraClient("http://127.0.0.1:8000") as c:
        job = c.submit(json.load(open("job.json")))
        for event in c.events(job.id):      # server-sent events, resumed after a drop
            print(event.seq, event.kind, event.data)
        c.download(job.id, "model.safetensors")   # resumable, sha256-checked

Every error answer raises ``ComeraError`` (the problem+json body). ``submit`` always sends an
``Idempotency-Key`` (a fresh uuid4 unless given), so a caller that retries after a timeout
with the same key cannot create the job twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from api_schemas import (
    TERMINAL_STATES,
    CheckpointPublic,
    CheckpointsPublic,
    CompressionReport,
    EventPublic,
    JobCreate,
    JobPublic,
    JobsPublic,
    MetricsPublic,
    RanksPublic,
    ValidationReport,
)
from client.download import DownloadResult, download_file
from client.errors import ComeraError
from client.sse import parse_sse

__all__ = ["ComeraClient", "DownloadResult"]

DEFAULT_URL = "http://127.0.0.1:8000"
STREAM_READ_TIMEOUT_S = 60.0  # the server sends a keep-alive comment every 15 s


def _body(spec: dict[str, Any] | JobCreate) -> dict[str, Any]:
    if isinstance(spec, JobCreate):
        return spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return spec


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class ComeraClient:
    """A synchronous client of one service (``base_url`` without ``/v1``)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": "comera-client/0.1", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> ComeraClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- plumbing -----------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, f"/v1{path}", **kwargs)
        if response.status_code >= 400:
            raise ComeraError.from_response(response)
        return response

    def ready(self) -> bool:
        """Whether ``/v1/readyz`` answers 200 (database and broker reachable)."""
        try:
            return self.http.get("/v1/readyz").status_code == 200
        except httpx.TransportError:
            return False

    # -- jobs ---------------------------------------------------------------------------------
    def submit(
        self, spec: dict[str, Any] | JobCreate, idempotency_key: str | None = None
    ) -> JobPublic:
        """``POST /v1/jobs``: the stored QUEUED job (422 ``ComeraError`` names bad fields)."""
        key = idempotency_key or str(uuid.uuid4())
        r = self._request("POST", "/jobs", json=_body(spec), headers={"Idempotency-Key": key})
        return JobPublic.model_validate(r.json())

    def validate(self, spec: dict[str, Any] | JobCreate) -> ValidationReport:
        """``POST /v1/jobs:validate``: the per-layer plan; nothing is stored."""
        return ValidationReport.model_validate(
            self._request("POST", "/jobs:validate", json=_body(spec)).json()
        )

    def get(self, job_id: str) -> JobPublic:
        return JobPublic.model_validate(self._request("GET", f"/jobs/{job_id}").json())

    def list(
        self,
        *,
        state: str | list[str] | None = None,
        labels: dict[str, str] | None = None,
        q: str | None = None,
        model: str | None = None,
        page_size: int = 50,
        limit: int | None = None,
    ) -> Iterator[JobPublic]:
        """The jobs, newest first, following ``next_cursor`` page by page (at most ``limit``)."""
        states = ",".join(state) if isinstance(state, list) else state
        params: dict[str, Any] = _params(state=states, q=q, model=model, limit=page_size)
        params["label"] = [f"{k}:{v}" for k, v in (labels or {}).items()]
        seen = 0
        while True:
            page = JobsPublic.model_validate(self._request("GET", "/jobs", params=params).json())
            for job in page.items:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield job
            if page.next_cursor is None:
                return
            params["cursor"] = page.next_cursor

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 2.0) -> JobPublic:
        """Poll until the job is SUCCEEDED, FAILED or CANCELLED; ``TimeoutError`` after
        ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout} s")
            pause = poll if deadline is None else min(poll, deadline - time.monotonic())
            time.sleep(max(0.0, pause))

    def cancel(
        self,
        job_id: str,
        *,
        mode: str = "graceful",
        save_partial: bool = True,
    ) -> JobPublic:
        body = {"mode": mode, "save_partial": save_partial}
        return JobPublic.model_validate(
            self._request("POST", f"/jobs/{job_id}/cancel", json=body).json()
        )

    def retry(self, job_id: str, *, from_: str = "latest_checkpoint") -> JobPublic:
        """FAILED / CANCELLED -> QUEUED as the next attempt, resuming ``from_`` the latest
        checkpoint, ``scratch`` or a checkpoint id."""
        return JobPublic.model_validate(
            self._request("POST", f"/jobs/{job_id}/retry", json={"from": from_}).json()
        )

    # -- series -------------------------------------------------------------------------------
    def metrics(
        self,
        job_id: str,
        *,
        keys: list[str] | None = None,
        stage: str | None = None,
        from_step: int | None = None,
        to_step: int | None = None,
        max_points: int = 500,
    ) -> MetricsPublic:
        params = _params(
            keys=",".join(keys) if keys else None,
            stage=stage,
            from_step=from_step,
            to_step=to_step,
            max_points=max_points,
        )
        return MetricsPublic.model_validate(
            self._request("GET", f"/jobs/{job_id}/metrics", params=params).json()
        )

    def ranks(
        self,
        job_id: str,
        *,
        tensor: str | None = None,
        stage: str | None = None,
        from_step: int | None = None,
        max_points: int = 500,
    ) -> RanksPublic:
        params = _params(tensor=tensor, stage=stage, from_step=from_step, max_points=max_points)
        return RanksPublic.model_validate(
            self._request("GET", f"/jobs/{job_id}/ranks", params=params).json()
        )

    def events(
        self, job_id: str, *, after: int = 0, kinds: list[str] | None = None, reconnect: int = 5
    ) -> Iterator[EventPublic]:
        """The job's events as they happen (SSE), from sequence number ``after`` on.

        The server closes the stream after the job's terminal state. A dropped connection
        (or a read timeout) reconnects with ``Last-Event-ID`` set to the last event received,
        so no event is lost or repeated; ``reconnect`` failures in a row give up (the error is
        raised). Error answers (404, 422) raise ``ComeraError`` at once."""
        last, failures = after, 0
        params = _params(kind=",".join(kinds) if kinds else None)
        timeout = httpx.Timeout(self.timeout, read=STREAM_READ_TIMEOUT_S)
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self.http.stream(
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    params=params,
                    headers=headers,
                    timeout=timeout,
                ) as r:
                    if r.status_code >= 400:
                        r.read()
                        raise ComeraError.from_response(r)
                    for sse in parse_sse(r.iter_lines()):
                        event = EventPublic.model_validate_json(sse.data)
                        if event.seq <= last:
                            continue
                        last, failures = event.seq, 0
                        yield event
                return  # the server ended the stream: the job is finished
            except httpx.TransportError:
                failures += 1
                if failures > reconnect:
                    raise
                time.sleep(min(0.25 * 2**failures, 5.0))

    # -- artifacts ----------------------------------------------------------------------------
    def checkpoints(self, job_id: str) -> list[CheckpointPublic]:
        r = self._request("GET", f"/jobs/{job_id}/checkpoints")
        return CheckpointsPublic.model_validate(r.json()).items

    def report(self, job_id: str) -> CompressionReport:
        """The compression measured on the exported file (409 until the job exported it)."""
        return CompressionReport.model_validate(
            self._request("GET", f"/jobs/{job_id}/report").json()
        )

    def export_checkpoint(self, job_id: str) -> CheckpointPublic:
        """The job's complete ``export`` checkpoint (the compressed model)."""
        found = [
            c for c in self.checkpoints(job_id) if c.kind == "export" and c.state == "complete"
        ]
        if not found:
            raise ComeraError(404, "Not Found", f"job {job_id} has no exported model (yet)")
        return found[-1]

    def download(
        self, job_id: str, path: str | Path, checkpoint_id: str | None = None, *, retries: int = 3
    ) -> DownloadResult:
        """Download a checkpoint file (default: the export) to ``path``; see
        :func:`client.download.download_file` for resuming and the sha256 check."""
        if checkpoint_id is None:
            checkpoint_id = self.export_checkpoint(job_id).id
        url = f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/content"
        return download_file(self.http, url, Path(path), retries=retries)

"""``comera watch``: a live progress bar for one job, fed by its event stream.

The bar shows the state and stage, step / total steps, the latest loss and accuracy and the
current compression ratio. Events update it as they arrive (``metric`` carries the step and
values, ``rank`` the ratio, ``stage`` and ``state`` the labels; those two also re-read the job
for its totals). If the stream is unavailable (an old server, a proxy that buffers, too many
dropped connections) it falls back to polling ``GET /v1/jobs/{id}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from api_schemas import TERMINAL_STATES, EventPublic, JobPublic
from client.api import ComeraClient
from client.errors import ComeraError
from client.render import fmt_ratio

__all__ = ["JobView", "follow"]


@dataclass
class JobView:
    """What the bar shows, updated from the job and from events."""

    state: str = "QUEUED"
    stage: str = "-"
    step: int = 0
    total: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    ratio: float | None = None
    notes: list[str] = field(default_factory=list)  # lines to print once (stage outcomes)

    def from_job(self, job: JobPublic) -> None:
        p, m = job.progress, job.latest_metrics
        self.state, self.step = job.state.value, max(self.step, p.step)
        self.total = p.total_steps or self.total
        if p.stage_name or p.stage_index is not None:
            self.stage = p.stage_name or f"stage {p.stage_index}"
        self.loss = m.get("loss", self.loss)
        self.accuracy = m.get("accuracy", m.get("val_accuracy", self.accuracy))
        self.ratio = job.compression.get("current_ratio") or self.ratio

    def apply(self, event: EventPublic) -> None:
        d: dict[str, Any] = event.data
        if event.kind == "state":
            self.state = d.get("state", self.state)
        elif event.kind == "stage" and d.get("phase") == "start":
            self.stage = d.get("name") or f"stage {d.get('index')}"
        elif event.kind == "stage" and d.get("phase") == "end" and "target_reached" in d:
            self.notes.append(stage_outcome(d))
        elif event.kind == "metric":
            self.step = max(self.step, int(d.get("step", 0)))
            values = d.get("values") or {}
            self.loss = values.get("loss", self.loss)
            self.accuracy = values.get("accuracy", values.get("val_accuracy", self.accuracy))
        elif event.kind == "rank":
            self.step = max(self.step, int(d.get("step", 0)))
            self.ratio = d.get("model_ratio") or d.get("ratio") or self.ratio

    def info(self) -> str:
        parts = [] if self.loss is None else [f"loss {self.loss:.4f}"]
        if self.accuracy is not None:
            parts.append(f"acc {self.accuracy:.3f}")
        parts.append(f"ratio {fmt_ratio(self.ratio)}")
        return "  ".join(parts)


def _show(progress: Progress, task: TaskID, view: JobView) -> None:
    progress.update(
        task,
        description=f"{view.state} {view.stage}",
        completed=view.step,
        total=view.total,
        steps=f"{view.step}/{view.total or '?'}",
        info=view.info(),
    )


def stage_outcome(d: dict[str, Any]) -> str:
    """One line on a stage with a size target: reached, or not and why."""
    name = d.get("name") or f"stage {d.get('index')}"
    sizes = f"size {d.get('size_end')} for a target of {round(d.get('size_ref') or 0)}"
    if d.get("target_reached"):
        return f"[green]{name}: size target reached[/] ({sizes})"
    return f"[yellow]{name}: size target not reached[/] ({sizes}): {d.get('reason') or '?'}"


def _stream(
    client: ComeraClient, job_id: str, view: JobView, redraw: Any, say: Any = print
) -> None:
    for event in client.events(job_id):
        view.apply(event)
        while view.notes:
            say(view.notes.pop(0))
        if event.kind in ("state", "stage") or view.total is None:
            view.from_job(client.get(job_id))
        redraw()


def _poll(client: ComeraClient, job_id: str, view: JobView, redraw: Any, poll: float) -> JobPublic:
    while True:
        job = client.get(job_id)
        view.from_job(job)
        redraw()
        if job.state in TERMINAL_STATES:
            return job
        time.sleep(poll)


def follow(
    client: ComeraClient,
    job_id: str,
    *,
    console: Console | None = None,
    poll: float = 2.0,
    stream: bool = True,
) -> JobPublic:
    """Show the job's progress until it ends; returns the final job."""
    view = JobView()
    view.from_job(client.get(job_id))
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
    )
    with progress:
        task = progress.add_task(job_id, total=view.total, steps="", info="")

        def redraw() -> None:
            _show(progress, task, view)

        redraw()
        if stream:
            try:
                _stream(client, job_id, view, redraw, progress.console.print)
            except (httpx.TransportError, ComeraError) as err:
                if isinstance(err, ComeraError) and err.status == 404:
                    raise
                progress.console.print(f"[yellow]event stream unavailable ({err}); polling[/]")
        return _poll(client, job_id, view, redraw, poll)  # after the stream: one read

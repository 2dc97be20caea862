"""Rich renderings of the service's wire types for the ``comera`` command line.

Pure functions from ``api_schemas`` models to rich tables, so the commands stay short and the
layout is in one place.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from api_schemas import CompressionReport, JobPublic, UploadedModelPublic, ValidationReport

__all__ = [
    "baseline_table",
    "distributed_line",
    "fmt_modes",
    "fmt_ratio",
    "job_summary",
    "job_table",
    "jobs_table",
    "models_table",
    "plan_table",
    "report_tables",
]

STATE_STYLE = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    "CANCELLED": "yellow",
    "CANCELLING": "yellow",
    "RUNNING": "cyan",
    "STARTING": "cyan",
    "QUEUED": "blue",
}


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"x{ratio:.2f}"


def fmt_modes(modes: dict[str, Any] | list[Any] | None) -> str:
    """``{"in": [8, 8], "out": [4, 16]}`` -> ``in 8x8, out 4x16``."""
    if modes is None:
        return "-"
    if isinstance(modes, list):
        return "x".join(map(str, modes))
    return ", ".join(
        f"{k} {'x'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in modes.items()
    )


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def _metrics(values: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in sorted(values.items()) if "/" not in k) or "-"


def _int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def _step(job: JobPublic) -> str:
    p = job.progress
    return f"{p.step}/{p.total_steps if p.total_steps is not None else '?'}"


def job_summary(job: JobPublic) -> str:
    """One line: id, state, step, loss and ratio (the end of ``comera watch``)."""
    loss = job.latest_metrics.get("loss")
    parts = [job.id, _state(job.state), f"step {_step(job)}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    parts.append(f"ratio {fmt_ratio(job.compression.get('current_ratio'))}")
    if job.compression.get("target_reached") is False:
        parts.append("[yellow]size target not reached[/]")
    if job.compression.get("at_chance"):
        parts.append("[red]accuracy at chance level[/]")
    return "  ".join(parts)


def target_line(target: dict[str, Any] | None) -> str | None:
    """The size target's outcome in words (``None``: the job had no target)."""
    if not target or "target_reached" not in target:
        return None
    if target["target_reached"]:
        return "reached"
    return f"[yellow]not reached[/]: {target.get('reason') or target.get('target_reason') or '?'}"


def chance_line(chance: dict[str, Any] | None) -> str | None:
    """The chance check in words (``None``: no accuracy to check)."""
    if not chance or "at_chance" not in chance:
        return None
    level = chance.get("chance", chance.get("chance_level"))
    if chance["at_chance"]:
        return f"[red]at chance level[/] ({level:.4f}): the model did not learn the task"
    return f"above chance ({level:.4f})"


def distributed_line(report: CompressionReport) -> str | None:
    """How a data-parallel job ran, in words (``None``: one process)."""
    d = report.execution.distributed if report.execution is not None else None
    if d is None:
        return None
    return (
        f"{d.world_size} processes ({d.backend}), {d.ddp_rebuilds} DDP wrapper builds "
        f"in {d.ddp_rebuild_seconds:.2f} s"
    )


def job_table(job: JobPublic) -> Table:
    """``comera status``: the job's fields as a two-column grid."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    p, c = job.progress, job.compression
    stage = "-" if p.stage_index is None else f"{p.stage_index + 1}/{p.stage_count} {p.stage_name}"
    rows = [
        ("id", job.id),
        ("name", job.name),
        ("state", _state(job.state)),
        ("message", job.message or "-"),
        ("attempt", f"{job.attempt}/{job.max_attempts}"),
        ("stage", stage),
        ("step", _step(job)),
        ("metrics", _metrics(job.latest_metrics)),
        (
            "ratio",
            f"{fmt_ratio(c.get('current_ratio'))} (params {_int(c.get('params_now'))} "
            f"of {_int(c.get('params_before'))})",
        ),
        ("size target", target_line(c) or "-"),
        ("chance", chance_line(c) or "-"),
        ("labels", ", ".join(f"{k}:{v}" for k, v in job.labels.items()) or "-"),
        ("created", job.created_at.isoformat(timespec="seconds")),
        ("finished", job.finished_at.isoformat(timespec="seconds") if job.finished_at else "-"),
    ]
    if job.error is not None:
        rows.append(("error", f"[red]{job.error.title}: {job.error.detail or ''}[/]"))
    for key, value in rows:
        t.add_row(key, str(value))
    return t


def models_table(models: list[UploadedModelPublic]) -> Table:
    """``comera models list``."""
    t = Table("id", "name", "model_type", "bytes", "created", box=None)
    for m in models:
        t.add_row(m.id, m.name, m.model_type, f"{m.size_bytes:,}", m.created_at.isoformat())
    return t


def jobs_table(jobs: list[JobPublic]) -> Table:
    """``comera list``."""
    t = Table("id", "name", "state", "step", "loss", "ratio", "created", box=None)
    for job in jobs:
        loss = job.latest_metrics.get("loss")
        t.add_row(
            job.id,
            job.name,
            _state(job.state),
            _step(job),
            "-" if loss is None else f"{loss:.4f}",
            fmt_ratio(job.compression.get("current_ratio")),
            job.created_at.isoformat(timespec="seconds"),
        )
    return t


def _value(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.4g}" if signed else f"{value:.4g}")


def baseline_table(report: CompressionReport) -> Table | None:
    """This job's metrics next to its dense baseline's, and the deltas (job - baseline)."""
    base = report.baseline
    if base is None:
        return None
    t = Table(
        "metric",
        "this job",
        "dense baseline",
        "delta",
        title=f"against the dense baseline {base.job_id}",
    )
    for key in sorted(report.metrics.keys() | base.metrics.keys()):
        t.add_row(
            key,
            _value(report.metrics.get(key)),
            _value(base.metrics.get(key)),
            _value(base.deltas.get(key), signed=True),
        )
    return t


def report_tables(report: CompressionReport) -> Group:
    """``comera report``: one row per layer, the totals, the metrics (per source of a mixed
    text split too) and the fidelity to the original model (``hf_bert``), then the comparison
    with the dense baseline if any."""
    title = f"compression of {report.job_id} (export {report.checkpoint_id})"
    layers = Table("name", "kind", "modes", "ranks", "dense params", "params", "ratio", title=title)
    for layer in report.layers:
        ratio = "cut" if layer.ratio is None else fmt_ratio(layer.ratio)
        layers.add_row(
            layer.name,
            layer.kind,
            fmt_modes(layer.modes),
            ",".join(map(str, layer.ranks)),
            f"{layer.dense_params:,}",
            f"{layer.params:,}",
            ratio,
        )
    totals = Table.grid(padding=(0, 2))
    totals.add_column(style="bold")
    totals.add_column()
    totals.add_row("params", f"{report.params:,} of {report.params_dense:,} dense")
    totals.add_row("tensorized layers", fmt_ratio(report.tensorized_ratio))
    totals.add_row("whole model", fmt_ratio(report.model_ratio))
    totals.add_row(
        "file",
        f"{report.file_bytes:,} bytes vs {report.dense_bytes:,} dense "
        f"({fmt_ratio(report.file_ratio)})",
    )
    totals.add_row("metrics", _metrics(report.metrics))
    for source, values in source_metrics(report).items():
        totals.add_row(f"  on {source}", _metrics(values))
    if (line := target_line(report.target)) is not None:
        totals.add_row("size target", line)
    if (line := chance_line(report.chance)) is not None:
        totals.add_row("chance", line)
    if (line := distributed_line(report)) is not None:
        totals.add_row("data parallel", line)
    if (auto := report.auto_rank) is not None:
        capped = f", capped: {', '.join(auto['capped'])}" if auto.get("capped") else ""
        totals.add_row(
            "max_rank auto",
            f"started at rank {auto.get('build_rank')} after "
            f"{(auto.get('probe') or {}).get('steps')} calibration steps{capped}",
        )
    for advice in report.advice or []:
        totals.add_row("advice", f"{advice.get('fix')} ({advice.get('reason')})")
    if (f := report.fidelity) is not None:
        totals.add_row(
            "fidelity",
            f"cosine {f.mean:.4f} (min {f.min:.4f}) on {f.sentences:,} "
            f"held-out sentences, {f.measured_on} vs the original",
        )
    if report.baseline is None:
        totals.add_row("dense baseline", "none (no SUCCEEDED dense job of the same spec)")
    base = baseline_table(report)
    deploy = deploy_table(report)
    extra = [t for t in (deploy, base) if t is not None]
    return Group(layers, totals, *extra)


def source_metrics(report: CompressionReport) -> dict[str, dict[str, float]]:
    """The last stage's validation metrics per source of a mixed text split (the engine's
    ``metrics_by_source``); ``{}`` for a split of one source."""
    if not report.stages:
        return {}
    parts = report.stages[-1].get("metrics_by_source") or {}
    return {str(k): v for k, v in parts.items() if isinstance(v, dict)}


def deploy_table(report: CompressionReport) -> Table | None:
    """``hf`` jobs: the exported model beside the original, as a deployer compares them."""
    d = report.deploy
    if d is None:
        return None
    t = Table(
        "",
        "exported (model/hf/)",
        f"original ({d.original.kind or 'dense'})",
        "original / exported",
        title=f"deployment on {d.device}, {d.seq_len} tokens a sequence",
    )
    names = sorted(set(d.exported.metrics) | set(d.original.metrics))
    for name in names:
        t.add_row(
            name, _value(d.exported.metrics.get(name)), _value(d.original.metrics.get(name)), ""
        )
    t.add_row(
        "parameters",
        f"{d.exported.parameters:,}",
        f"{d.original.parameters:,}",
        fmt_ratio(d.ratios.get("parameters")),
    )
    t.add_row(
        "file bytes",
        f"{d.exported.file_bytes:,}" if d.exported.file_bytes else "-",
        f"{d.original.file_bytes:,}" if d.original.file_bytes else "-",
        fmt_ratio(d.ratios.get("file_bytes")),
    )
    for key in ("batch_1", "throughput"):
        e, o = getattr(d.exported, key), getattr(d.original, key)
        ratio = d.ratios.get("speedup_batch_1" if key == "batch_1" else "speedup_throughput")
        t.add_row(
            f"latency, batch {e.batch}",
            f"{e.latency_ms:.2f} ms",
            f"{o.latency_ms:.2f} ms",
            fmt_ratio(ratio),
        )
        mem = d.ratios.get("memory_throughput") if key == "throughput" else None
        t.add_row(
            f"peak memory, batch {e.batch}",
            f"{e.peak_bytes / 2**20:.1f} MiB",
            f"{o.peak_bytes / 2**20:.1f} MiB",
            fmt_ratio(mem) if mem is not None else "",
        )
    return t


def plan_table(plan: ValidationReport) -> Group:
    """``comera validate``: what the job would build."""
    t = Table(
        "name", "kind", "shape", "modes", "initial ranks", "dense params", "params", title="plan"
    )
    for layer in plan.layers:
        t.add_row(
            layer.name,
            layer.kind,
            "x".join(map(str, layer.shape)),
            fmt_modes(layer.modes),
            ",".join(map(str, layer.initial_ranks)),
            f"{layer.dense_params:,}",
            f"{layer.params:,}",
        )
    lines = [
        f"params {plan.params_before:,} -> {plan.params_after:,} "
        f"(tensorized {fmt_ratio(plan.tensorized_ratio)}); "
        f"memory ~{plan.estimated_memory_bytes / 2**20:.1f} MiB; "
        f"steps {plan.total_steps or '?'}"
    ]
    for name, choice in (plan.automatic or {}).items():  # max_rank / gamma "auto"
        lines.append(f"{name}: auto, chosen by the run ({choice.get('rule', '')})")
    lines += [f"[yellow]warning:[/] {w}" for w in plan.warnings]
    return Group(t, *lines)

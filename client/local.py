"""``comera run``: one job spec trained in this process, without a server.

The spec is the service's (``api_schemas.JobCreate``), prepared by the same function the
service uses (:func:`service.store.prepare.prepare_job`: the dataset and the model source
resolved under ``--data-root``, the spec translated) and run by the engine's one-job runner, so
a spec that works here works when submitted; an engine error names the spec's field as the
service would (:func:`api_schemas.engine_spec.engine_pointer`). The engine, torch and the
service's preparation are imported when ``run_spec`` is called, so the client package stays
importable without them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from api_schemas import JobCreate
from api_schemas.engine_spec import SpecError, engine_pointer

__all__ = ["run_spec"]


def _pointer(loc: tuple[Any, ...]) -> str:
    return "".join(f"/{p}" for p in loc if p not in ("function-after", "function-before"))


def _engine_error(err: Any, spec: JobCreate) -> str:
    """An engine ``ConfigError`` as the service reports it: the spec's field, then why."""
    pointer = engine_pointer(err.field, spec) or "(body)"
    return f"{pointer}: {err.message} (engine field {err.field or '(job)'})"


def _fail(console: Console, lines: list[str]) -> int:
    console.print("[red]error:[/] invalid job spec", highlight=False)
    for line in lines:
        console.print(f"  {line}", highlight=False, markup=False)
    return 2


def run_spec(
    body: dict[str, Any], out: Path, *, data_root: Path = Path("."), console: Console | None = None
) -> int:
    """Train ``body`` into ``out``; returns the exit status (0 completed, 1 not, 2 bad spec or
    data)."""
    import torch
    from pydantic import ValidationError

    from engine.data.errors import DataError
    from engine.train import ConfigError, JobConfig
    from engine.train.cli import run_job
    from service.store.prepare import Roots, prepare_job

    console = console or Console(stderr=True)
    try:
        spec = JobCreate.model_validate(body)
    except ValidationError as err:
        return _fail(
            console, [f"{_pointer(e['loc']) or '(body)'}: {e['msg']}" for e in err.errors()]
        )
    wanted = spec.training.device
    device = ("cuda" if torch.cuda.is_available() else "cpu") if wanted == "auto" else wanted
    try:  # the service's preparation, with --data-root as the data root and no store
        prepared = prepare_job(spec, Roots(data=data_root, data_name="--data-root"), device=device)
        job = JobConfig.from_dict(prepared.engine_config)
    except SpecError as err:
        return _fail(console, [str(err)])
    except ConfigError as err:
        return _fail(console, [_engine_error(err, spec)])
    console.print(f"running {spec.name} on {device} into {out}", highlight=False)
    try:
        report = run_job(job, out, progress=sys.stderr.isatty())
    except ConfigError as err:  # what only building the model or the data can tell
        return _fail(console, [_engine_error(err, spec)])
    except DataError as err:  # a malformed row: file, line and what was expected
        console.print(f"[red]error:[/] bad data: {err}", highlight=False)
        return 2
    status = report.get("status")
    ratio = (report.get("compression") or {}).get("tensorized_ratio")
    export = report.get("export") or {}
    console.print(
        f"{status}: {report.get('steps')} steps in {report.get('wall_seconds')} s; "
        f"tensorized ratio {ratio if ratio is None else f'x{ratio:.2f}'}; model "
        f"{export.get('path', '-')} ({export.get('bytes', '-')} bytes); "
        f"report {out / 'report.json'}",
        highlight=False,
    )
    return 0 if status == "completed" else 1

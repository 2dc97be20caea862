"""The ``comera`` command: submit, follow and fetch jobs of a CoMERA service, or run one locally.

::

    comera submit job.json                # prints the job id
    comera watch JOB                      # live progress; exit 0 only if SUCCEEDED
    comera download JOB -o model.safetensors
    comera report JOB
    comera models upload DIR              # a Hugging Face directory for arch "hf" jobs
    comera models list / delete MODEL
    comera run job.json --out runs/one    # the same spec trained in this process, no server
    comera up                             # the embedded service (API + one local worker)
    comera keys create --tenant acme      # a new API key, printed once

Client commands talk HTTP only (``--url`` / ``COMERA_URL``, ``--api-key`` / ``COMERA_API_KEY``,
else the key ``comera up`` left in ``$COMERA_HOME/api_key``). ``run`` and the server commands
(``up``, ``migrate``, ``api``, ``worker``, ``reaper``, ``keys``, implemented in
``service.cli``) import the engine or the server when invoked, so the rest of this module
loads without torch or the server packages.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from client.api import DEFAULT_URL, ComeraClient
from client.errors import ComeraError
from client.models import delete_model, list_models, upload_model
from client.render import (
    job_summary,
    job_table,
    jobs_table,
    models_table,
    plan_table,
    report_tables,
)
from client.watch import follow

__all__ = ["app", "load_spec"]

app = typer.Typer(
    help="CoMERA compression service: client and server commands.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

models_app = typer.Typer(help="Model directories for arch 'hf' jobs (model.source uploaded).")
app.add_typer(models_app, name="models")
JobArg = Annotated[str, typer.Argument(help="job id (job_...)")]
SpecArg = Annotated[
    Path, typer.Argument(help="job spec, .json (or .yaml with PyYAML)", exists=True, dir_okay=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the JSON document")]


@dataclass(frozen=True)
class Options:
    url: str
    api_key: str | None


def _out() -> Console:
    return Console()


def _err() -> Console:
    return Console(stderr=True)


def _print(model: Any, rendered: Any, as_json: bool) -> None:
    if as_json:
        _out().print_json(model.model_dump_json())
    else:
        _out().print(rendered)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(envvar="COMERA_URL", help="service URL")] = DEFAULT_URL,
    api_key: Annotated[
        str | None, typer.Option(envvar="COMERA_API_KEY", help="API key (Bearer)")
    ] = None,
) -> None:
    ctx.obj = Options(url=url, api_key=api_key or _key_from_home())


def _key_from_home() -> str | None:
    """The key ``comera up`` left in ``$COMERA_HOME/api_key`` (default ``~/.comera``), if any:
    the local client needs no flag against the local service."""
    home = Path(os.environ.get("COMERA_HOME") or Path.home() / ".comera")
    try:
        return (home / "api_key").read_text().strip() or None
    except OSError:
        return None


@contextmanager
def _client(ctx: typer.Context) -> Iterator[ComeraClient]:
    """A client for the global options; service errors become a message and exit status 1
    (2 when the service cannot be reached)."""
    opts: Options = ctx.obj
    try:
        with ComeraClient(opts.url, api_key=opts.api_key) as client:
            yield client
    except ComeraError as err:
        _err().print(f"[red]error:[/] {err}", highlight=False, markup=True)
        raise typer.Exit(1) from None
    except httpx.TransportError as err:
        _err().print(f"[red]error:[/] cannot reach the service at {opts.url}: {err}")
        raise typer.Exit(2) from None


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec from JSON, or YAML (``.yaml`` / ``.yml``; needs PyYAML)."""
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            _err().print(
                "[red]error:[/] YAML specs need PyYAML (pip install pyyaml); "
                "or give the spec as JSON"
            )
            raise typer.Exit(2) from None
        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            _err().print(f"[red]error:[/] {path} is not valid JSON: {err}")
            raise typer.Exit(2) from None
    if not isinstance(data, dict):
        _err().print(f"[red]error:[/] {path} must hold one JSON object (the job spec)")
        raise typer.Exit(2)
    return data


# -- client commands -----------------------------------------------------------------------------
@app.command()
def submit(
    ctx: typer.Context,
    spec: SpecArg,
    key: Annotated[str | None, typer.Option(help="Idempotency-Key (default: new)")] = None,
) -> None:
    """Submit a job; prints its id (details on stderr)."""
    with _client(ctx) as client:
        job = client.submit(load_spec(spec), idempotency_key=key)
    typer.echo(job.id)
    pending = " (broker unavailable: it will be sent later)" if job.enqueue_pending else ""
    _err().print(f"submitted {job.name}: {job.state.value}{pending}", highlight=False)


@app.command()
def validate(ctx: typer.Context, spec: SpecArg, as_json: JsonOpt = False) -> None:
    """Dry run: the per-layer plan of a spec; nothing is stored."""
    with _client(ctx) as client:
        plan = client.validate(load_spec(spec))
    _print(plan, plan_table(plan), as_json)


@app.command()
def status(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The job: state, stage, step, latest metrics, current ratio."""
    with _client(ctx) as client:
        job = client.get(job_id)
    _print(job, job_table(job), as_json)


@app.command("list")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="comma list of states")] = None,
    label: Annotated[list[str] | None, typer.Option(help="k:v, repeatable")] = None,
    q: Annotated[str | None, typer.Option(help="substring of the name")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 50,
) -> None:
    """Jobs, newest first."""
    labels = {}
    for item in label or []:
        k, sep, v = item.partition(":")
        if not sep:
            raise typer.BadParameter(f"{item!r} is not key:value", param_hint="--label")
        labels[k] = v
    with _client(ctx) as client:
        jobs = list(
            client.list(state=state, labels=labels, q=q, limit=limit, page_size=min(limit, 200))
        )
    _out().print(jobs_table(jobs))


@app.command()
def watch(
    ctx: typer.Context,
    job_id: JobArg,
    poll: Annotated[float, typer.Option(help="seconds between polls (fallback)")] = 2.0,
    no_stream: Annotated[bool, typer.Option(help="poll instead of events")] = False,
) -> None:
    """Follow a job to its end with a live progress bar; exit 0 only if it SUCCEEDED."""
    with _client(ctx) as client:
        job = follow(client, job_id, poll=poll, stream=not no_stream)
    _out().print(job_summary(job), highlight=False)
    if job.error is not None:
        _err().print(f"[red]{job.error.title}:[/] {job.error.detail or ''}", highlight=False)
    raise typer.Exit(0 if job.state.value == "SUCCEEDED" else 1)


@app.command()
def download(
    ctx: typer.Context,
    job_id: JobArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="file or directory")],
    checkpoint: Annotated[
        str | None, typer.Option(help="checkpoint id (default: the exported model)")
    ] = None,
) -> None:
    """Download the compressed model (or a checkpoint): resumable, sha256-checked."""
    with _client(ctx) as client:
        if output.is_dir():
            output = output / f"{checkpoint or job_id}.safetensors"
        result = client.download(job_id, output, checkpoint_id=checkpoint)
    how = f", resumed at byte {result.resumed_from:,}" if result.resumed_from else ""
    how += ", partial file discarded" if result.restarted else ""
    _out().print(
        f"{result.path} ({result.size:,} bytes, sha256 {result.sha256[:16]}... verified{how})",
        highlight=False,
    )


@app.command()
def cancel(
    ctx: typer.Context,
    job_id: JobArg,
    immediate: Annotated[bool, typer.Option(help="no final checkpoint")] = False,
) -> None:
    """Cancel a job (graceful: it checkpoints first)."""
    with _client(ctx) as client:
        job = client.cancel(job_id, mode="immediate" if immediate else "graceful")
    _out().print(job_summary(job), highlight=False)


@app.command()
def retry(
    ctx: typer.Context,
    job_id: JobArg,
    from_: Annotated[
        str, typer.Option("--from", help="latest_checkpoint, scratch or a checkpoint id")
    ] = "latest_checkpoint",
) -> None:
    """Run a FAILED or CANCELLED job again as its next attempt."""
    with _client(ctx) as client:
        job = client.retry(job_id, from_=from_)
    _out().print(f"{job_summary(job)}  attempt {job.attempt}", highlight=False)


@app.command()
def report(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The compression report measured on the exported file: per layer, totals, metrics."""
    with _client(ctx) as client:
        rep = client.report(job_id)
    _print(rep, report_tables(rep), as_json)


# -- one job in this process -------------------------------------------------------------------
@models_app.command("upload")
def models_upload(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="model dir")],
    name: Annotated[str | None, typer.Option(help="default: the directory's name")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a Hugging Face directory (config.json, model.safetensors, tokenizer.json); prints
    its id, for ``model.source: {"kind": "uploaded", "id": ...}``."""
    with _client(ctx) as client:
        model = upload_model(client, directory, name)
    _print(model, model.id, as_json)


@models_app.command("list")
def models_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The tenant's models, newest first."""
    with _client(ctx) as client:
        models = list_models(client)
    if as_json:
        _out().print_json(json.dumps([m.model_dump(mode="json") for m in models]))
    else:
        _out().print(models_table(models))


@models_app.command("delete")
def models_delete(
    ctx: typer.Context, model_id: Annotated[str, typer.Argument(help="model id (mdl_...)")]
) -> None:
    """Delete a model (refused while a job that has not finished uses it)."""
    with _client(ctx) as client:
        delete_model(client, model_id)
    _out().print(f"deleted {model_id}")


@app.command()
def run(
    spec: SpecArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory")],
    data_root: Annotated[Path, typer.Option(help="base of 'path' datasets")] = Path("."),
) -> None:
    """Train one spec here, no server (needs the engine): model/ and report.json in OUT."""
    from client.local import run_spec

    raise typer.Exit(run_spec(load_spec(spec), out, data_root=data_root, console=_err()))


# -- server commands (service.cli) ----------------------------------------------------------------
SERVER = {
    "context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
    "add_help_option": False,
}


# name -> help; each passes its arguments to service.cli's command of that name
SERVER_COMMANDS = {
    "up": "Run the API and a local worker with an embedded store and broker (see up --help).",
    "migrate": "Apply the database migrations (see migrate --help).",
    "api": "Serve only the API; workers run separately (see api --help).",
    "worker": "Run one worker: one job at a time, on one GPU (see worker --help).",
    "reaper": (
        "Requeue jobs of lost workers, resend lost messages, force cancels (see reaper --help)."
    ),
    "keys": "API keys: create --tenant NAME [--scope S], list, revoke ID (see keys --help).",
}


def _server(name: str) -> Callable[[typer.Context], None]:
    """The command ``comera <name> ARGS...``: ``service.cli``'s ``<name> ARGS...``."""

    def command(ctx: typer.Context) -> None:
        from service.cli import app as server_app

        server_app(args=[name, *ctx.args], prog_name="comera")

    return command


for _name, _help in SERVER_COMMANDS.items():
    app.command(_name, help=_help, **SERVER)(_server(_name))

if __name__ == "__main__":
    sys.exit(app())

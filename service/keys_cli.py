"""``comera keys create|list|revoke``: API keys, managed next to the database like migrations.

These commands talk to the store directly (``COMERA_DATABASE_URL``), so an operator can make
the first key before any exists. ``create`` prints the key once, on stdout, and nothing keeps
it; listings show only the prefix. ``ensure_first_key`` is what ``comera up`` calls: on the
first start of an embedded service it makes an admin key for the ``default`` tenant, prints it
once and leaves it, readable only by its owner, in ``$COMERA_HOME/api_key`` for the local
``comera`` client.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from service.cli_settings import load_settings
from service.store.auth import DEFAULT_SCOPES
from service.store.settings import Settings

__all__ = ["KEY_FILE", "app", "ensure_first_key", "write_key_file"]

KEY_FILE = "api_key"
app = typer.Typer(help="API keys (stored as sha256; shown once).", no_args_is_help=True)


def _sessions(settings: Settings):  # noqa: ANN202 (a sessionmaker)
    from service.store.db.session import make_engine, make_sessionmaker

    return make_sessionmaker(make_engine(settings.db_url, pool_size=1, max_overflow=0))


def _keys():  # noqa: ANN202 (the module)
    """The key store, imported on use: ``service.cli`` imports this module, so every process
    it starts would load the ORM at start (a third of a second; the API's spawned planner
    children import ``service.cli`` again as their main module)."""
    from service.store.db.crud import api_keys

    return api_keys


def write_key_file(home: Path, key: str) -> Path:
    """``home/api_key`` with mode 0600, created that way (never world-readable, not even
    for a moment)."""
    path = home / KEY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return path


def ensure_first_key(settings: Settings) -> str | None:
    """Make the first key if the store has none: returns its plaintext (to print once),
    else ``None``."""
    sessions = _sessions(settings)
    with sessions() as session:
        if _keys().has_active_key(session=session):
            return None
        _, key = _keys().create_key(
            session=session, tenant="default", scopes=(*DEFAULT_SCOPES, "admin")
        )
    write_key_file(settings.home, key)
    return key


@app.command()
def create(
    tenant: Annotated[str, typer.Option(help="tenant name (created if new)")],
    scope: Annotated[
        list[str] | None,
        typer.Option(help="repeatable: jobs:read, jobs:write, artifacts:read, admin"),
    ] = None,
) -> None:
    """Create a key and print it once on stdout (default scopes: read, write, artifacts)."""
    if not 1 <= len(tenant) <= 128:
        raise typer.BadParameter("1 to 128 characters", param_hint="--tenant")
    settings = load_settings()
    with _sessions(settings)() as session:
        try:
            row, key = _keys().create_key(
                session=session, tenant=tenant, scopes=scope or DEFAULT_SCOPES
            )
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--scope") from None
        typer.echo(
            f"created key {row.id} (prefix {row.prefix}) for tenant {tenant!r}, "
            f"scopes {', '.join(row.scopes)}",
            err=True,
        )
    typer.echo(key)


@app.command("list")
def list_(show_revoked: bool = False) -> None:
    """Every key: id, prefix, tenant, scopes, created, revoked (never the key)."""
    from service.store.db.models import Tenant

    settings = load_settings()
    with _sessions(settings)() as session:
        names = {t.id: t.name for t in session.query(Tenant).all()}
        for k in _keys().list_keys(session=session):
            if k.revoked_at is not None and not show_revoked:
                continue
            revoked = f"  revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else ""
            tenant, scopes = names.get(k.tenant_id, "?"), ",".join(k.scopes)
            typer.echo(
                f"{k.id}  cmr_{k.prefix}_…  {tenant:<16} {scopes:<40} "
                f"{k.created_at:%Y-%m-%d %H:%M}{revoked}"
            )


@app.command()
def revoke(key_id: str) -> None:
    """Revoke a key by id (API processes notice within ``COMERA_KEY_CACHE_SECONDS``)."""
    settings = load_settings()
    with _sessions(settings)() as session:
        if not _keys().revoke_key(session=session, key_id=key_id):
            typer.echo(f"no active key {key_id}", err=True)
            raise typer.Exit(1)
    typer.echo(f"revoked {key_id}", err=True)

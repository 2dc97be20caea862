"""Throwaway databases for tests, created only through the Alembic migrations.

PostgreSQL: the local server (127.0.0.1:5432, trust auth); each call creates a database
``comera_t_<random>`` and drops it afterwards. SQLite: a file in a temporary directory.
``COMERA_TEST_PG`` overrides the server URL (its path names the maintenance database).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

from service.store.db.migrate import upgrade

__all__ = ["PG_SERVER", "migrated_postgres", "migrated_sqlite", "postgres_available"]

PG_SERVER = os.environ.get("COMERA_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _admin_engine():
    url = "postgresql+psycopg://" + PG_SERVER.removeprefix("postgresql://")
    return create_engine(url, isolation_level="AUTOCOMMIT")


def postgres_available() -> bool:
    try:
        with _admin_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:  # noqa: BLE001 (any failure means: not available)
        return False


@contextmanager
def migrated_postgres() -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database, dropped on exit."""
    name = f"comera_t_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def migrated_sqlite(directory: Path) -> Iterator[str]:
    """URL of a fresh, migrated SQLite database file in ``directory``."""
    url = f"sqlite:///{directory / f'comera_{uuid.uuid4().hex[:8]}.db'}"
    upgrade(url)
    yield url

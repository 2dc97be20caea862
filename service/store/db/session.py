"""Engines and sessions. SQLite gets WAL and a busy timeout; every engine pings before use.

Create engines after fork (the worker does so in ``worker_process_init``): a connection pool
must never be shared across processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["make_engine", "make_sessionmaker", "session_scope"]


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API connection)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, *, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    """An engine for ``url``; the pool sizes apply to PostgreSQL (SQLite opens per thread)."""
    if url.startswith("sqlite"):
        args = {"check_same_thread": False, "timeout": 30}
        engine = create_engine(url, pool_pre_ping=True, connect_args=args)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(
        url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow, pool_timeout=10
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session

"""Readiness checks (``/v1/readyz``): the database answers ``SELECT 1`` and the broker accepts a
connection, each within a short timeout. Each check returns None when healthy, else a reason.

kombu's SQLAlchemy transport (``sqla+<url>``, embedded mode) connects lazily, so for it the
check runs ``SELECT 1`` on the broker's database itself.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text

__all__ = ["TIMEOUT_S", "check_broker", "check_database"]

TIMEOUT_S = 2.0


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def check_database(engine: Engine) -> str | None:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:  # noqa: BLE001 (any failure: not ready)
        return _reason(err)
    return None


def _check_sql_broker(url: str) -> str | None:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    args = {"connect_timeout": int(TIMEOUT_S)} if url.startswith("postgresql") else {}
    engine = create_engine(url, connect_args=args)
    try:
        return check_database(engine)
    finally:
        engine.dispose()


def check_broker(url: str) -> str | None:
    if url.startswith("sqla+"):
        return _check_sql_broker(url.removeprefix("sqla+"))
    from kombu import Connection  # late: only the readiness probe needs it

    options = {"socket_connect_timeout": TIMEOUT_S, "socket_timeout": TIMEOUT_S}
    try:
        with Connection(url, connect_timeout=TIMEOUT_S, transport_options=options) as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=TIMEOUT_S
            )
    except Exception as err:  # noqa: BLE001 (any failure: not ready)
        return _reason(err)
    return None

from tests.service_fixtures import db_url, pg_url, sqlite_url  # noqa: F401

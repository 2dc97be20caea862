from tests.service.api_helpers import api, api_lite  # noqa: F401  (HTTP API fixtures)
from tests.service_fixtures import db_url, pg_url, sqlite_url  # noqa: F401

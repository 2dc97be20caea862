"""The web dashboard: ``GET /`` (the page) and ``GET /static/{name}`` (its scripts and styles).

The files ship in the package, directly in ``service/static/`` (no sub-folders), and are
served without authentication: they hold no data. The page asks for the API key itself and
sends it on every ``/v1`` request. Only names that match ``NAME`` and have a known suffix are
served, looked up in a listing of that one folder, so no path can leave it (``..``, encoded
slashes, absolute paths and dot files all answer 404).

Caching: every answer carries a strong ``ETag`` (a hash of the content) and
``Cache-Control: no-cache``, so a browser revalidates each time and gets a 304 while the file
is unchanged; an upgraded server is never paired with stale scripts. The page sends a
Content-Security-Policy that allows only this origin's scripts, styles and API (it holds the
API key, so no inline or third-party script may run).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request, Response

__all__ = ["STATIC_DIR", "router"]

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*\.[a-z0-9]+$")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)

router = APIRouter(tags=["dashboard"], include_in_schema=False)


@cache
def _shipped() -> frozenset[str]:
    """The servable file names: read once (the package does not change while it runs)."""
    if not STATIC_DIR.is_dir():
        return frozenset()
    names = (p.name for p in STATIC_DIR.iterdir() if p.is_file())
    return frozenset(n for n in names if NAME.match(n) and Path(n).suffix in CONTENT_TYPES)


@cache
def _load(name: str) -> tuple[bytes, str]:
    """(content, strong ETag) of one shipped file."""
    body = (STATIC_DIR / name).read_bytes()
    return body, f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def _serve(name: str, request: Request, if_none_match: str | None) -> Response:
    if name not in _shipped():
        raise HTTPException(404, "Not found.")
    body, etag = _load(name)
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if name == "index.html":
        headers |= {
            "Content-Security-Policy": CSP,
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
        }
    if if_none_match is not None and etag in (t.strip() for t in if_none_match.split(",")):
        return Response(status_code=304, headers=headers)
    media_type = CONTENT_TYPES[Path(name).suffix]
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(body))
        return Response(status_code=200, headers=headers, media_type=media_type)
    return Response(body, headers=headers, media_type=media_type)


@router.api_route("/", methods=["GET", "HEAD"], response_class=Response)
def dashboard_page(
    request: Request, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    """The dashboard page (no authentication: it asks for the key and holds no data)."""
    return _serve("index.html", request, if_none_match)


@router.api_route("/static/{name}", methods=["GET", "HEAD"], response_class=Response)
def dashboard_file(
    name: str, request: Request, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    """One file of the dashboard, by its bare name (no sub-folders, no dot files)."""
    return _serve(name, request, if_none_match)

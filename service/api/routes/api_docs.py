"""The API's interactive documentation without the internet: ``GET /docs`` (Swagger UI) and
``GET /redoc`` (ReDoc), their scripts, styles and icon served from ``/docs-assets/``.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so an offline deployment shows a
blank page. The pinned ``fastapi-offline`` wheel (pyproject.toml) ships the same files; this
module serves them from its package folder, and the pages name only same-origin URLs: no
Google fonts for ReDoc, no online validator badge for Swagger UI. Both pages send a
Content-Security-Policy that lets the browser load and connect to this origin only (ReDoc's
sidebar names its vendor's logo on a CDN: the browser never asks for it, and ReDoc leaves the
image out). ``create_app`` turns FastAPI's pages off (``docs_url=None``, ``redoc_url=None``)
and mounts these instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS", "ASSETS_DIR", "install_api_docs"]

ASSETS = "/docs-assets"
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
SWAGGER_JS, SWAGGER_CSS = f"{ASSETS}/swagger-ui-bundle.js", f"{ASSETS}/swagger-ui.css"
REDOC_JS, FAVICON = f"{ASSETS}/redoc.standalone.js", f"{ASSETS}/favicon.png"

# the inline script is FastAPI's Swagger UI start-up; ReDoc injects styles and starts a worker
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(tags=["docs"], include_in_schema=False)


def _openapi_url(request: Request) -> str:
    return request.scope.get("root_path", "") + (request.app.openapi_url or "/openapi.json")


def _page(
    request: Request, render: Callable[..., HTMLResponse], name: str, **files: Any
) -> HTMLResponse:
    """``render``'s page on this service's OpenAPI document, titled ``name``, under :data:`CSP`."""
    page = render(openapi_url=_openapi_url(request), title=f"{request.app.title} - {name}", **files)
    page.headers["Content-Security-Policy"] = CSP
    return page


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on this service's OpenAPI document, with its files from ``/docs-assets``."""
    return _page(
        request,
        get_swagger_ui_html,
        "Swagger UI",
        swagger_js_url=SWAGGER_JS,
        swagger_css_url=SWAGGER_CSS,
        swagger_favicon_url=FAVICON,
        swagger_ui_parameters={"validatorUrl": None},  # the badge would call an outside host
    )


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    """ReDoc on this service's OpenAPI document, with its script from ``/docs-assets``."""
    return _page(
        request,
        get_redoc_html,
        "ReDoc",
        redoc_js_url=REDOC_JS,
        redoc_favicon_url=FAVICON,
        with_google_fonts=False,
    )


def install_api_docs(app: FastAPI) -> None:
    """The two pages and their files (``app`` made with ``docs_url=None, redoc_url=None``)."""
    if not ASSETS_DIR.is_dir():  # a broken install: fail at start, not with a blank page
        raise RuntimeError(f"the Swagger UI and ReDoc files are missing from {ASSETS_DIR}")
    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

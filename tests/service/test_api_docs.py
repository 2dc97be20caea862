"""``/docs`` and ``/redoc`` work offline (``service.api.routes.api_docs``): the pages name only
same-origin URLs, the files they name are served with their types, and in Debian's chromium,
with every request to another origin blocked, Swagger UI and ReDoc draw the API's operations.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from service.api.routes.api_docs import ASSETS_DIR
from service.main import create_app
from service.store.settings import Settings
from tests.helpers.services import free_port, wait_for
from tests.service.api_helpers import Api
from tests.service.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

URL_ATTR = re.compile(r"""(?:src|href|url|spec-url)\s*[=:]\s*["']([^"']*)["']""")
TYPES = {
    "/docs-assets/swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "/docs-assets/swagger-ui.css": "text/css; charset=utf-8",
    "/docs-assets/redoc.standalone.js": "text/javascript; charset=utf-8",
    "/docs-assets/favicon.png": "image/png",
}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_name_only_same_origin_urls(api_lite: Api, page: str):
    client = api_lite.client
    client.headers.pop("Authorization", None)  # the pages need no API key
    resp = client.get(page)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/html; charset=utf-8"
    assert "://" not in resp.text, "the page names another origin"
    csp = resp.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    urls = URL_ATTR.findall(resp.text)
    assert "/openapi.json" in urls
    assert urls and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    for url in urls:
        assert client.get(url).status_code == 200, url


def test_the_docs_files_are_served_with_their_types(api_lite: Api):
    client = api_lite.client
    client.headers.pop("Authorization", None)
    for url, content_type in TYPES.items():
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert resp.headers["content-type"] == content_type, url
        assert resp.content == (ASSETS_DIR / url.rsplit("/", 1)[1]).read_bytes()
    assert client.get("/docs-assets/../main.py").status_code == 404
    assert client.get("/docs-assets/nope.js").status_code == 404


@pytest.fixture
def local_server(sqlite_url: str, tmp_path: Path) -> Iterator[str]:
    """The API served by uvicorn in a thread of this process, on a migrated SQLite store."""
    port = free_port()
    app = create_app(Settings(home=tmp_path / "home", database_url=sqlite_url))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="docs-server", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 15, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture
def offline_page(local_server: str) -> Iterator[tuple[Any, list[str], list[str]]]:
    """A chromium page that may reach ``local_server`` only; (page, blocked URLs, errors)."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent (scripts/test.sh installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []
    errors: list[str] = []

    def only_local(route: Any) -> None:
        url = route.request.url
        if url.startswith((f"{local_server}/", "data:", "blob:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort("internetdisconnected")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900})
            context.route("**/*", only_local)
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            yield page, blocked, errors
        finally:
            browser.close()


def test_swagger_ui_and_redoc_render_the_operations_with_the_network_blocked(
    local_server: str, offline_page: tuple[Any, list[str], list[str]]
):
    page, blocked, errors = offline_page
    page.goto(f"{local_server}/docs")
    page.wait_for_selector(".opblock", timeout=10_000)
    operations = page.eval_on_selector_all(
        ".opblock",
        "(els) => els.map((e) => e.querySelector('.opblock-summary-method').textContent + ' '"
        " + e.querySelector('.opblock-summary-path').dataset.path)",
    )
    assert "POST /v1/jobs" in operations, operations
    assert "GET /v1/jobs/{job_id}" in operations, operations
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("CoMERA")

    page.goto(f"{local_server}/redoc")
    page.wait_for_selector("[data-section-id^='operation/']", timeout=10_000)
    assert page.locator("[data-section-id^='operation/']").count() >= len(operations) // 2
    assert blocked == [], f"the pages asked for other origins: {blocked}"
    assert errors == [], errors

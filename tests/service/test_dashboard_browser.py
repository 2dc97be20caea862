"""The web dashboard: its static routes, then the page in a real browser on a real service.

The route tests run on the app in process. The browser tests start ``comera up`` (embedded:
SQLite store and broker, a local Celery worker), submit the tiny job over HTTP and drive
Debian's ``/usr/bin/chromium`` through Playwright: the page takes the API key from the URL
fragment, follows the job live until it has finished, draws its curves (every point of every
series, at positions linear in step and value), the per-layer rank trajectories, the
compression and the stage boundaries, and downloads the compressed model with the key (its
sha256 is checked here). The console must stay free of errors. The screenshot goes to the
test's tmp folder, and to ``bench/results/dashboard.png`` when ``COMERA_SAVE_SCREENSHOT``
is set.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.routes.dashboard import STATIC_DIR
from tests.helpers.services import ROOT, TINY_JOB, clean_env, free_port, start_cli, stop
from tests.service.api_helpers import Api

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCRIPTS = ("app.js", "api.js", "plots.js", "dom.js")
VERTEX = re.compile(r"([MLHV])\s*([-\d.]+)(?:\s+([-\d.]+))?")


# -- the static routes (in process) ----------------------------------------------------------
def test_page_and_static_files_are_served_with_types_and_cache_headers(api_lite: Api):
    client = api_lite.client
    client.headers.pop("Authorization", None)  # the page and its files need no API key
    page = client.get("/")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="/static/app.js">' in page.text
    assert client.get("/", headers={"If-None-Match": page.headers["etag"]}).status_code == 304
    head = client.head("/")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(page.content)

    types = {
        ".js": "text/javascript; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".svg": "image/svg+xml",
        ".html": "text/html; charset=utf-8",
    }
    for path in STATIC_DIR.iterdir():  # the package-data glob is static/*: no sub-folders
        assert path.is_file(), f"{path} would not be packaged"
        resp = client.get(f"/static/{path.name}")
        assert resp.status_code == 200, path.name
        assert resp.headers["content-type"] == types[path.suffix]
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.content == path.read_bytes()
        again = client.get(f"/static/{path.name}", headers={"If-None-Match": resp.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    for name in SCRIPTS:  # every module a script imports ships too
        for imported in re.findall(r'from "\./([\w.]+)"', (STATIC_DIR / name).read_text()):
            assert (STATIC_DIR / imported).is_file(), f"{name} imports {imported}"


@pytest.mark.parametrize(
    "path",
    [
        "/static/..%2Fmain.py",
        "/static/%2e%2e%2fmain.py",
        "/static/%2e%2e",
        "/static/%2e",
        "/static/.hidden",
        "/static/sub%2Fapp.js",
        "/static/app.js%00.css",
        "/static/nope.js",
        "/static/%2Fetc%2Fpasswd",
        "/static/..%5Cmain.py",
        "/static/",
        "/static/main.py",
    ],
)
def test_no_file_outside_the_static_folder_is_served(api_lite: Api, path: str):
    api_lite.client.headers.pop("Authorization", None)
    resp = api_lite.client.get(path)
    expected = 422 if "%00" in path else 404  # a NUL is refused first (service.nul_guard)
    assert resp.status_code == expected, (path, resp.status_code)
    assert "import" not in resp.text  # no Python (or any other) source leaked


# -- the page in a browser on a real service -------------------------------------------------
@dataclass
class Service:
    url: str
    key: str | None
    client: httpx.Client
    log: Path


def _wait(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/v1/readyz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent (scripts/test.sh installs Debian's chromium)")
    tmp = tmp_path_factory.mktemp("dashboard")
    port, home, log = free_port(), tmp / "home", tmp / "up.log"
    proc = start_cli(["up", "--port", str(port)], clean_env(home), log)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120) as client:  # the first POST plans slowly
            _wait(lambda: _ready(client) or proc.poll() is not None, 120, "comera up")
            assert proc.poll() is None, log.read_text()
            key_file = home / "api_key"  # written by `comera up` once API keys exist
            key = key_file.read_text().strip() if key_file.exists() else None
            if key:
                client.headers["Authorization"] = f"Bearer {key}"
            yield Service(url, key, client, log)
    finally:
        stop([proc], [log])


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's chromium under Playwright, one per module (one sync Playwright at a time)."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent (scripts/test.sh installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def browser(service: Service, chromium: Any) -> Any:
    return chromium


def _assert_linear(pixels: list[float], values: list[float], what: str) -> None:
    """Pixel positions are an affine function of the values (same order, exact spacing)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    i, j = order[0], order[-1]
    if values[i] == values[j]:
        assert max(pixels) - min(pixels) < 0.2, what
        return
    scale = (pixels[j] - pixels[i]) / (values[j] - values[i])
    for p, v in zip(pixels, values, strict=True):
        assert p == pytest.approx(pixels[i] + scale * (v - values[i]), abs=0.3), what


def _plot(page, name: str) -> dict[str, Any]:
    """What the page drew in one figure: paths with their vertices, legend, stage markers."""
    return page.evaluate(
        """(name) => {
      const fig = document.querySelector(`figure[data-plot="${name}"]`);
      const paths = [...fig.querySelectorAll("path.series")].map((p) => ({
        label: p.dataset.label, n: Number(p.dataset.points), d: p.getAttribute("d"),
        length: p.getTotalLength(), stroke: getComputedStyle(p).stroke,
        width: parseFloat(getComputedStyle(p).strokeWidth)}));
      const stages = [...fig.querySelectorAll("g.stage-boundary")].map((g) => ({
        step: Number(g.dataset.step), name: g.dataset.stage,
        line: g.querySelector("line") !== null}));
      const legend = [...fig.querySelectorAll("ul.legend li")].map((li) => li.dataset.label);
      return {paths, stages, legend};
    }""",
        name,
    )


def _series_vertices(d: str) -> list[tuple[float, float]]:
    """Data points of a path: M and L are points; in a step path each ``H x V y`` is one."""
    points: list[tuple[float, float]] = []
    pending_x: float | None = None
    for cmd, a, b in VERTEX.findall(d):
        if cmd in "ML":
            points.append((float(a), float(b)))
        elif cmd == "H":
            pending_x = float(a)
        else:
            assert pending_x is not None, d
            points.append((pending_x, float(a)))
            pending_x = None
    return points


def _check_metric_plot(
    page, name: str, api_series: dict[str, list[dict[str, Any]]], labels: dict[str, str]
) -> None:
    drawn = {p["label"]: p for p in _plot(page, name)["paths"]}
    expected = {labels[k]: pts for k, pts in api_series.items() if k in labels and pts}
    assert set(drawn) == set(expected), (name, set(drawn), set(expected))
    for label, points in expected.items():
        path = drawn[label]
        vertices = _series_vertices(path["d"])
        assert path["n"] == len(vertices) == len(points), (name, label)
        assert path["length"] > 10 and path["width"] > 0 and path["stroke"] != "none"
        _assert_linear([x for x, _ in vertices], [p["step"] for p in points], f"{label} x")
        # SVG y grows downwards: y is an affine function of -value
        _assert_linear([y for _, y in vertices], [-p["value"] for p in points], f"{label} y")


@pytest.mark.slow
def test_dashboard_follows_a_job_live_and_downloads_its_model(
    service: Service, browser: Any, tmp_path: Path
):
    client = service.client
    resp = client.post(
        "/v1/jobs",
        json={**TINY_JOB, "name": "dashboard-mlp"},
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]

    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    requests: list[Any] = []
    page.on("request", lambda r: requests.append(r))
    page.goto(f"{service.url}/" + (f"#key={service.key}" if service.key else ""))
    assert "key=" not in page.evaluate("location.href")  # taken out of the address bar
    assert page.evaluate("sessionStorage.getItem('comera.apiKey')") == service.key

    page.click(f'#jobs a[href="#job={job_id}"]')  # select the job while it is queued / running
    page.wait_for_selector(f'#detail[data-job="{job_id}"]')

    def finished() -> dict[str, Any] | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    try:
        job = _wait(finished, 240, "the job to finish")
    except AssertionError:
        raise AssertionError(service.log.read_text()[-3000:]) from None
    assert job["state"] == "SUCCEEDED", job.get("error")
    # no reload: the event stream brings the page to the finished job
    page.wait_for_selector('#detail[data-state="SUCCEEDED"]', timeout=30_000)
    page.wait_for_selector("#download-export:not([disabled])")
    # the size target's outcome is on the page, as the job resource has it
    reached = job["compression"]["target_reached"]
    notice = page.text_content("#target-notice") or ""
    assert notice.startswith("Size target reached" if reached else "Size target not reached")
    if not reached:
        assert job["compression"]["target_reason"] in notice
    assert page.query_selector("#chance-notice") is None  # the tiny job learns its task
    # no dense job of the same spec ran: the page says so (and no deployment table: not hf)
    page.wait_for_selector("#baseline-none")
    assert page.query_selector("#deploy-table") is None
    assert page.query_selector("#sources-table") is None  # one source of data: no such table

    base = f"/v1/jobs/{job_id}"
    keys = ["loss", "val_loss", "accuracy", "val_accuracy"]
    metrics = client.get(f"{base}/metrics", params={"keys": ",".join(keys)}).json()["series"]
    series = {s["key"]: s["points"] for s in metrics}
    assert all(series[k] for k in keys)
    labels = {
        "loss": "train loss",
        "val_loss": "validation loss",
        "accuracy": "train accuracy",
        "val_accuracy": "validation accuracy",
    }
    _check_metric_plot(page, "loss", series, {k: labels[k] for k in keys[:2]})
    _check_metric_plot(page, "accuracy", series, {k: labels[k] for k in keys[2:]})

    ranks = client.get(f"{base}/ranks").json()["points"]
    per_layer: dict[str, int] = {}
    for p in ranks:
        per_layer[p["tensor"]] = per_layer.get(p["tensor"], 0) + 1
    rank_plot = _plot(page, "ranks")
    assert len(per_layer) >= 2
    assert {p["label"]: p["n"] for p in rank_plot["paths"]} == per_layer  # one line per layer
    assert sorted(rank_plot["legend"]) == sorted(per_layer)
    for path in rank_plot["paths"]:
        assert len(_series_vertices(path["d"])) == path["n"] and path["length"] > 10
    compression = _plot(page, "compression")["paths"]
    assert len(compression) == 1 and compression[0]["length"] > 10
    assert compression[0]["n"] == len({p["step"] for p in ranks})

    stage_events = client.get(f"{base}/events", params={"kind": "stage"}).json()["items"]
    starts = [
        (e["data"]["step"], e["data"]["name"])
        for e in stage_events
        if e["data"]["phase"] == "start"
    ]
    assert [name for _, name in starts] == ["early", "late", "finetune"]
    for name in ("loss", "accuracy", "ranks", "compression"):
        stages = _plot(page, name)["stages"]
        assert [(m["step"], m["name"]) for m in stages] == starts, name
        assert [m["line"] for m in stages] == [step > 0 for step, _ in starts], name

    export = next(
        c for c in client.get(f"{base}/checkpoints").json()["items"] if c["kind"] == "export"
    )
    with page.expect_download() as download_info:
        page.click("#download-export")
    download = download_info.value
    assert download.suggested_filename == f"{export['id']}.{export['format']}"
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == export["sha256"]
    page.wait_for_selector("#download-status.ok")
    assert "sha256 verified" in page.inner_text("#download-status")  # 127.0.0.1: secure context

    if service.key:  # the key went out on every API request, and nowhere else
        api_calls = [r for r in requests if "/v1/" in r.url]
        assert api_calls and all(
            r.header_value("authorization") == f"Bearer {service.key}" for r in api_calls
        )
        assert not any(r.header_value("authorization") for r in requests if "/v1/" not in r.url)
        assert httpx.get(f"{service.url}{base}").status_code == 401  # so the header mattered

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("COMERA_SAVE_SCREENSHOT"):
        shutil.copyfile(shot, ROOT / "bench" / "results" / "dashboard.png")
    assert errors == []
    context.close()


@pytest.mark.slow
def test_key_form_when_the_page_has_no_key(service: Service, browser: Any):
    if service.key is None:
        pytest.skip("this server does not require API keys")
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{service.url}/")
    page.wait_for_selector("#status.error")
    assert "API key" in page.inner_text("#status")
    assert page.evaluate("document.activeElement.id") == "key-input"
    page.fill("#key-input", service.key)
    page.click('#key-form button[type="submit"]')
    # the job list loaded with the key (whether or not this process's server has a job yet)
    page.wait_for_selector("#jobs-updated:not(:empty)")
    assert page.is_hidden("#status")
    assert page.inner_text("#key-state") == "key set"
    context.close()


# -- the report's comparison tables, on answers the test serves ------------------------------
T_DONE = "2026-01-02T03:04:05Z"
HF_JOB = "job_hfdeploy"
DEPLOY = {
    "seq_len": 128,
    "device": "cpu",
    "threads": 2,
    "exported": {
        "metrics": {"accuracy": 0.8125},
        "parameters": 4_567_890,
        "file_bytes": 18_345_678,
        "batch_1": {"batch": 1, "latency_ms": 3.25, "tokens_per_second": 39384.6,
                    "peak_bytes": 25 * 2**20},
        "throughput": {"batch": 32, "latency_ms": 41.5, "tokens_per_second": 98698.8,
                       "peak_bytes": 96 * 2**20},
    },
    "original": {
        "metrics": {"accuracy": 0.84375},
        "parameters": 22_713_216,
        "file_bytes": 90_868_376,
        "kind": "pretrained",
        "batch_1": {"batch": 1, "latency_ms": 4.5, "tokens_per_second": 28444.4,
                    "peak_bytes": 98 * 2**20},
        "throughput": {"batch": 32, "latency_ms": 83.0, "tokens_per_second": 49349.4,
                       "peak_bytes": 211 * 2**20},
    },
    "ratios": {"parameters": 4.9725, "file_bytes": 4.9532, "speedup_batch_1": 1.3846,
               "speedup_throughput": 2.0, "memory_throughput": 2.1979},
}  # fmt: skip


def _served_report() -> dict[str, Any]:
    """A finished ``hf`` job's report with a deployment table and a dense baseline, as the
    wire schema has it (validated here, so the page is tested on what the API may send)."""
    from api_schemas.artifacts import CompressionReport

    report = {
        "job_id": HF_JOB,
        "checkpoint_id": "ckpt_export",
        "file_bytes": 18_345_678,
        "dense_bytes": 90_868_376,
        "file_ratio": 4.953,
        "params": 4_567_890,
        "params_dense": 22_713_216,
        "tensorized_ratio": 12.5,
        "model_ratio": 4.97,
        "layers": [
            {"name": "encoder.layer.0.intermediate.dense", "kind": "tt_linear",
             "modes": {"in": [16, 24], "out": [32, 48]}, "ranks": [1, 8, 1],
             "dense_params": 589_824, "params": 16_384, "ratio": 36.0},
        ],
        "metrics": {"accuracy": 0.8125, "loss": 0.45},
        "stages": [
            {"name": "early", "metrics_by_source": {"docstrings": {"cosine": 0.5}}},
            {"name": "finetune", "metrics": {"cosine": 0.9}, "metrics_by_source": {
                "docstrings": {"cosine": 0.9375, "loss": 0.0625},
                "questions": {"cosine": 0.875, "loss": 0.125}}},
        ],
        "spec_hash": "0" * 64,
        "deploy": DEPLOY,
        "baseline": {"job_id": "job_dense", "metrics": {"accuracy": 0.84375, "loss": 0.4},
                     "deltas": {"accuracy": -0.03125, "loss": 0.05}},
    }  # fmt: skip
    return CompressionReport.model_validate(report).model_dump(mode="json")


def _served_job() -> dict[str, Any]:
    from api_schemas import JobPublic

    job = {
        "id": HF_JOB, "name": "hf-deploy", "labels": {}, "state": "SUCCEEDED", "attempt": 1,
        "max_attempts": 2, "version": 3,
        "progress": {"stage_name": "finetune", "stage_index": 2, "stage_count": 3, "step": 300,
                     "total_steps": 300, "fraction": 1.0},
        "latest_metrics": {"val_accuracy": 0.8125, "val_loss": 0.45},
        "compression": {"current_ratio": 12.5, "report_checkpoint_id": "ckpt_export"},
        "created_at": T_DONE, "started_at": T_DONE, "finished_at": T_DONE, "updated_at": T_DONE,
        "spec": {}, "spec_hash": "0" * 64,
    }  # fmt: skip
    return JobPublic.model_validate(job).model_dump(mode="json")


def _serve(route: Any, answers: dict[str, Any]) -> None:
    """The page's files from the static folder, the API from ``answers`` (by path)."""
    import json
    from urllib.parse import urlsplit

    path = urlsplit(route.request.url).path
    if path == "/":
        return route.fulfill(path=str(STATIC_DIR / "index.html"))
    if path.startswith("/static/"):
        return route.fulfill(path=str(STATIC_DIR / path.removeprefix("/static/")))
    if path in answers:
        return route.fulfill(content_type="application/json", body=json.dumps(answers[path]))
    return route.fulfill(status=404, content_type="application/json", body='{"title": "Not Found"}')


def _table(page, selector: str) -> dict[str, Any]:
    return page.evaluate(
        """(sel) => {
      const t = document.querySelector(sel);
      return {caption: t.caption.textContent,
              head: [...t.tHead.rows[0].cells].map((c) => c.textContent),
              rows: [...t.tBodies[0].rows].map((r) => [...r.cells].map((c) => c.textContent))};
    }""",
        selector,
    )


def test_dashboard_shows_the_deployment_table_and_the_dense_baseline_of_a_report(chromium: Any):
    """The columns of ``comera report``: the exported model/hf/ beside the original (task
    metric, parameters, file bytes, latency and peak memory at batch 1 and at the throughput
    batch, the sequence length), and this job's metrics beside its dense baseline's."""
    base = f"/v1/jobs/{HF_JOB}"
    job = _served_job()
    answers = {
        "/v1/jobs": {"items": [job], "next_cursor": None},
        base: job,
        f"{base}/metrics": {"job_id": HF_JOB, "series": []},
        f"{base}/ranks": {"job_id": HF_JOB, "points": []},
        f"{base}/events": {"items": [], "next_cursor": None},
        f"{base}/checkpoints": {"items": []},
        f"{base}/report": _served_report(),
    }
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        page.route("http://dashboard.test/**", lambda route: _serve(route, answers))
        page.goto(f"http://dashboard.test/#key=k&job={HF_JOB}")
        page.wait_for_selector("#deploy-table")
        deploy = _table(page, "#deploy-table")
        baseline = _table(page, "#baseline-table")
        sources = _table(page, "#sources-table")
        cards = page.inner_text(".cards")
    finally:
        context.close()

    assert deploy["caption"] == "Deployment on cpu, 2 threads, 128 tokens a sequence"
    assert deploy["head"] == [
        "",
        "Exported (model/hf/)",
        "Original (pretrained)",
        "Original / exported",
    ]
    assert deploy["rows"] == [
        ["accuracy", "0.8125", "0.8438", ""],
        ["parameters", "4,567,890", "22,713,216", "4.97×"],
        ["file bytes", "18,345,678", "90,868,376", "4.95×"],
        ["latency, batch 1", "3.25 ms", "4.50 ms", "1.38×"],
        ["peak memory, batch 1", "25.0 MiB", "98.0 MiB", ""],
        ["latency, batch 32", "41.50 ms", "83.00 ms", "2×"],
        ["peak memory, batch 32", "96.0 MiB", "211.0 MiB", "2.2×"],
    ]
    assert baseline["caption"] == "Against the dense baseline job_dense"
    assert baseline["head"] == ["Metric", "This job", "Dense baseline", "Delta"]
    assert baseline["rows"] == [
        ["accuracy", "0.8125", "0.8438", "-0.03125"],
        ["loss", "0.45", "0.4", "+0.05"],
    ]
    # the last stage's metrics per source of its mixed validation text
    assert sources["caption"] == "Validation metrics per source of the text (last stage)"
    assert sources["head"] == ["Source", "cosine", "loss"]
    assert sources["rows"] == [["docstrings", "0.9375", "0.0625"], ["questions", "0.875", "0.125"]]
    # the compression card names both ratios; the accuracy card the dense baseline's
    assert "12.5×" in cards and "tensorized layers · whole model 4.97×" in cards
    assert "dense baseline 0.8438" in cards
    assert errors == []

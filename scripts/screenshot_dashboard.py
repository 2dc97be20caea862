"""A screenshot of the dashboard showing a finished job (the README's picture).

    .venv/bin/python scripts/screenshot_dashboard.py [--home runs/service] [--job ID]
                                                     [--url URL] [--out bench/results/dashboard.png]

Run ``bash scripts/demo.sh`` first: this starts ``comera up`` on the demo's home (its SQLite
store, its API key) on a free port, or uses a service already running at ``--url`` (the key
is read from ``HOME/api_key`` either way), picks the newest SUCCEEDED compressed job unless
``--job`` names one, opens the dashboard on it in Debian's chromium driven by Playwright (it
never downloads a browser), waits until the job's report is drawn, and saves a full-page
screenshot.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "service"))  # the demo's own service helpers
from run_embedded import comera_up, wait_ready  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def newest_compressed_job(client: httpx.Client) -> str:
    """The newest SUCCEEDED job that compressed (not a dense twin)."""
    items = client.get("/v1/jobs", params={"limit": 50}).raise_for_status().json()["items"]
    for job in items:
        method = job["spec"].get("compression", {}).get("method", "comera")
        if job["state"] == "SUCCEEDED" and method != "dense":
            return job["id"]
    sys.exit("no SUCCEEDED compressed job: run bash scripts/demo.sh first")


def screenshot(url: str, key: str, job_id: str, out: Path, width: int = 1400) -> None:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is absent: apt-get install chromium (Debian's)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.goto(f"{url}/#key={key}&job={job_id}")
            page.wait_for_selector(f'#detail[data-job="{job_id}"][data-state="SUCCEEDED"]')
            page.wait_for_selector("table.layers")  # the report has arrived
            page.wait_for_selector(f'#jobs tr[data-job="{job_id}"]')
            page.evaluate("document.fonts.ready")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def _show(url: str, key: str, job_id: str | None, out: Path) -> int:
    with httpx.Client(base_url=url, timeout=60) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        job_id = job_id or newest_compressed_job(client)
    screenshot(url, key, job_id, out)
    print(f"{out}: the dashboard on {job_id}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=ROOT / "runs/service")
    ap.add_argument("--job", help="the job to show (default: the newest SUCCEEDED compressed)")
    ap.add_argument("--url", help="a service already running on HOME (default: start one)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/dashboard.png")
    args = ap.parse_args()
    key_file = args.home / "api_key"
    if not key_file.exists():
        sys.exit(f"{key_file} is missing: run bash scripts/demo.sh first")
    key = key_file.read_text().strip()
    if args.url is not None:  # a service already running on HOME
        wait_ready(args.url)
        return _show(args.url, key, args.job, args.out)
    with comera_up(args.home, "screenshot-up.log") as url:
        return _show(url, key, args.job, args.out)


if __name__ == "__main__":
    sys.exit(main())

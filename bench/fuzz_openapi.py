"""Schemathesis over the whole API with more cases than CI runs: a nightly-style fuzz.

    python -m bench.fuzz_openapi [--examples 200] [--negative 100] [--out PATH]

Runs ``tests/service/test_fuzz_openapi.py`` (every operation of the OpenAPI document on a
real PostgreSQL store, schema-valid and schema-violating requests; no 5xx, documented
statuses, headers and bodies, every 4xx a problem document) with ``--examples`` valid and
``--negative`` violating cases per operation instead of CI's 15 and 8, and writes the count
of cases run, by status and by operation, with the outcome and the time, to
``bench/results/fuzz_openapi.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_info, write_json

TEST = "tests/service/test_fuzz_openapi.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="valid cases per operation")
    ap.add_argument("--negative", type=int, default=100, help="violating cases per operation")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: results dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuzz_") as tmp:
        tally = Path(tmp) / "tally.json"
        env = {
            **os.environ,
            "COMERA_FUZZ_EXAMPLES": str(args.examples),
            "COMERA_FUZZ_NEGATIVE_EXAMPLES": str(args.negative),
            "COMERA_FUZZ_REPORT": str(tally),
        }
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o"]
        proc = subprocess.run([*cmd, "timeout=0", TEST], env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        cases = json.loads(tally.read_text()) if tally.exists() else None
    payload = {
        "benchmark": "fuzz_openapi",
        "machine": machine_info(),
        "examples_per_operation": {"positive": args.examples, "negative": args.negative},
        "passed": proc.returncode == 0,
        "seconds": round(seconds, 1),
        "cases": cases,
        "pytest_tail": proc.stdout[-3000:],
    }
    if args.out is not None:
        args.out.write_text(json.dumps(payload, indent=1))
    path = args.out or write_json("fuzz_openapi", payload)
    runs = {m: cases[m]["run"] for m in ("positive", "negative")} if cases else None
    print(f"fuzz_openapi: passed={payload['passed']} cases={runs} in {seconds:.0f} s; {path}")
    sys.exit(0 if payload["passed"] else 1)


if __name__ == "__main__":
    main()

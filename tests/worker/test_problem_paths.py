"""Server paths never reach a tenant through a job's problem object (worker.problems): cut
out of ``detail`` and of every ``errors[].message``, in both their given and resolved forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from api_schemas.engine_spec import SpecError
from engine.train import ConfigError
from worker.problems import problem_for


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    data, artifacts = tmp_path / "data", tmp_path / "artifacts"
    data.mkdir()
    artifacts.mkdir()
    return data, artifacts


def _leaks(problem: dict, roots: tuple[Path, ...]) -> list[str]:
    texts = [problem["detail"], *(e["message"] for e in problem.get("errors", []))]
    return [t for t in texts for r in roots if str(r) in t or str(r.resolve()) in t]


def test_spec_error_messages_lose_the_data_root(roots):
    data, _ = roots
    exc = SpecError("/dataset/path", f"{data}/corpus/train.jsonl is not a file")
    kind, problem = problem_for(exc, roots=roots)
    assert kind == "validation"
    assert _leaks(problem, roots) == []
    [error] = problem["errors"]
    assert error == {
        "pointer": "/dataset/path",
        "message": "corpus/train.jsonl is not a file",
        "code": "spec",
    }


def test_engine_config_error_messages_lose_both_roots(roots):
    data, artifacts = roots
    exc = ConfigError(
        "data.path", f"cannot read {data.resolve()}/x.npz next to {artifacts}/jobs/j/attempt-1"
    )
    kind, problem = problem_for(exc, roots=roots)
    assert kind == "validation"
    assert _leaks(problem, roots) == []
    assert problem["errors"][0]["message"] == "cannot read x.npz next to jobs/j/attempt-1"
    assert problem["errors"][0]["pointer"] == "/dataset/path"

"""Every job file of ``examples/engine`` is a valid job as committed: its config parses and so do
its generator's parameters (a recipe that only a long benchmark runs is checked here too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.configs import ConfigError
from engine.data.synthetic import parse_params
from engine.train import JobConfig

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "engine").glob("*.json"))


def _check(job: dict) -> None:
    JobConfig.from_dict(job)
    data = job["data"]
    if data.get("generator"):
        parse_params(data["generator"], data.get("params"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_job_parses(path: Path):
    _check(json.loads(path.read_text()))


def test_a_bad_edit_of_a_mixed_recipe_is_refused():
    assert len(EXAMPLES) >= 8
    mixed = [
        job
        for job in (json.loads(p.read_text()) for p in EXAMPLES)
        if job["data"].get("params", {}).get("also")
    ]
    assert mixed
    job = mixed[0]
    job["data"]["params"]["weights"] = {"poems": 2}
    with pytest.raises(ConfigError, match="data.params.weights"):
        _check(job)

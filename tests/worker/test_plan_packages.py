"""The plan of a ``stdlib_text`` job with ``packages``: the packages are listed (installed?
within the file bound?) but never parsed; parsing torch's 2,282 files took past the planner's
30 s deadline. Checked by making the parse fail, not by a clock: the control shows that the
training data's builder does reach that parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.configs import ConfigError
from engine.data import build_data, stdlib_text
from engine.train import JobConfig
from tests.helpers.hf_bert import write_tiny_bert
from tests.helpers.specs import engine_job, finetune_stage, model_spec, synthetic_data
from worker import data_facts
from worker.plan import plan_job

PACKAGES = ["sympy", "networkx"]


def _job(model_dir: Path, packages: list[str]) -> dict[str, Any]:
    return engine_job(
        model=model_spec("hf_bert", {"path": str(model_dir)}),
        data=synthetic_data(
            "stdlib_text", n_train=64, n_valid=8, max_len=16, params={"packages": packages}
        ),
        schedule=[finetune_stage(steps=2)],
        training={"batch_size": 8},
    )


@pytest.fixture
def no_parse(monkeypatch) -> list[tuple[str, ...]]:
    """``package_sentences`` raises; the packages ``check_packages`` was asked for."""

    def parse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the packages' docstrings were parsed")

    listed: list[tuple[str, ...]] = []
    check = stdlib_text.check_packages

    def listing(packages: tuple[str, ...]) -> list[Path]:
        listed.append(tuple(packages))
        return check(packages)

    monkeypatch.setattr(stdlib_text, "package_sentences", parse)
    monkeypatch.setattr(data_facts, "check_packages", listing)
    return listed


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("plan-packages") / "bert")


def test_the_plan_lists_the_packages_and_never_parses_them(bert, no_parse):
    plan = plan_job(_job(bert, PACKAGES))
    assert no_parse == [tuple(PACKAGES)]
    assert plan["total_steps"] == 2


def test_a_package_that_is_not_installed_names_its_field(bert, no_parse):
    with pytest.raises(ConfigError) as err:
        plan_job(_job(bert, ["no_such_package_here"]))
    assert err.value.field == "data.params.packages"
    assert "'no_such_package_here' is not an installed package" in err.value.message


def test_control_the_training_data_does_parse_them(bert, no_parse):
    cfg = JobConfig.from_dict(_job(bert, PACKAGES))
    with pytest.raises(AssertionError, match="were parsed"):
        build_data(cfg.data, arch="hf_bert", batch_size=8, seed=0, model_config=cfg.model.config)

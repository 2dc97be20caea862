"""Bounds of the generators' ``dataset.params`` on the wire (:mod:`api_schemas.generator_limits`):
``stdlib_text``'s ``packages`` are refused at the edge where the engine would refuse them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api_schemas import JobCreate
from api_schemas.generator_limits import MAX_PACKAGES, MAX_WEIGHT
from engine.configs import ConfigError
from engine.data.stdlib_text import StdlibTextParams
from tests.helpers.specs import api_job, early_stage, model_spec, package, synthetic_dataset


def _job(packages) -> dict:
    return api_job(
        name="docs",
        model=model_spec("hf_bert", source=package()),
        dataset=synthetic_dataset("stdlib_text", params={"packages": packages}),
        schedule=[early_stage(steps=3)],
    )


@pytest.mark.parametrize(
    "packages",
    [["a-b"], ["x", "x"], [f"p{i}" for i in range(MAX_PACKAGES + 1)], "numpy", [3], ["a" * 65]],
)
def test_bad_packages_are_a_validation_error_at_dataset_params_packages(packages):
    with pytest.raises(ValidationError) as err:
        JobCreate.model_validate(_job(packages))
    (error,) = err.value.errors()
    assert error["loc"][-3:] == ("dataset", "params", "packages")
    with pytest.raises(ConfigError):  # the engine refuses the same values
        StdlibTextParams(packages=tuple(packages) if isinstance(packages, list) else packages)


def test_package_names_pass_the_wire():
    spec = JobCreate.model_validate(_job(["numpy", "sympy"]))
    assert spec.dataset.params == {"packages": ["numpy", "sympy"]}


@pytest.mark.parametrize("also", ["comments", [3], ["x" * 33], ["comments"] * 9])
def test_bad_also_is_a_validation_error_at_dataset_params_also(also):
    job = _job(["numpy"])
    job["dataset"]["params"]["also"] = also
    with pytest.raises(ValidationError) as err:
        JobCreate.model_validate(job)
    (error,) = err.value.errors()
    assert error["loc"][-3:] == ("dataset", "params", "also")
    job["dataset"]["params"]["also"] = ["comments", "descriptions"]
    assert JobCreate.model_validate(job).dataset.params["also"] == ["comments", "descriptions"]


@pytest.mark.parametrize(
    "weights",
    [["questions", 2], {"questions": 0}, {"questions": -1}, {"questions": MAX_WEIGHT + 1},
     {"questions": "2"}, {"questions": True}, {"x" * 33: 2}, {f"s{i}": 1 for i in range(10)}],
)  # fmt: skip
def test_bad_weights_are_a_validation_error_at_dataset_params_weights(weights):
    job = _job(["numpy"])
    job["dataset"]["params"]["also"] = ["questions"]
    job["dataset"]["params"]["weights"] = weights
    with pytest.raises(ValidationError) as err:
        JobCreate.model_validate(job)
    for error in err.value.errors():  # a value of the wrong type: one error per union branch
        assert error["loc"][:3] == ("dataset", "params", "weights"), error
    with pytest.raises(ConfigError, match="data.params.weights"):  # so does the engine
        StdlibTextParams(also=("questions",), weights=weights)
    job["dataset"]["params"]["weights"] = {"questions": 4}
    assert JobCreate.model_validate(job).dataset.params["weights"] == {"questions": 4}

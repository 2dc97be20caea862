"""The wire's defaults for a job that leaves the ranks to the engine: ``compression.max_rank``
``"auto"`` and ``gamma`` ``"auto"`` on a targeted early stage (:class:`api_schemas.JobCreate`),
filled into the normalized spec that ``:validate`` answers with, and translated to the
engine as given."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api_schemas import JobCreate
from api_schemas.engine_spec import to_engine
from engine.train.job import JobConfig
from tests.helpers.specs import api_job, early_stage, hf_dir, late_stage, model_spec


def test_a_target_alone_fills_auto_rank_and_auto_gamma():
    spec = JobCreate.model_validate(api_job(schedule=[early_stage(steps=4, target_ratio=0.3)]))
    assert spec.compression.max_rank == "auto" and spec.schedule[0].gamma == "auto"
    dumped = spec.model_dump(mode="json")  # what :validate shows as the normalized spec
    assert dumped["compression"]["max_rank"] == "auto"
    assert dumped["schedule"][0]["gamma"] == "auto"
    again = JobCreate.model_validate(dumped)  # re-validation (stored specs) changes nothing
    assert again.model_dump(mode="json") == dumped
    engine = to_engine(spec)
    assert engine["compression"]["max_rank"] == "auto"
    assert JobConfig.from_dict(engine).compression.options.max_rank == "auto"


def test_a_late_target_from_compression_counts_and_gammas_stay_fixed():
    spec = JobCreate.model_validate(
        api_job(
            schedule=[early_stage(steps=4), late_stage(steps=4)],
            compression={"target_ratio": 0.5},
        )
    )
    assert spec.compression.max_rank == "auto"
    assert [s.gamma for s in spec.schedule] == [0.01, 0.01]


@pytest.mark.parametrize(
    ("compression", "stage"),
    [
        ({"max_rank": 8}, {}),  # a rank given
        ({}, {"gamma": "auto"}),  # a gamma given
        ({"method": "dense"}, None),  # nothing to tensorize
    ],
)
def test_a_given_rank_or_gamma_keeps_the_fixed_rank(compression, stage):
    stages = [early_stage(steps=4, target_ratio=0.3, **stage)] if stage is not None else None
    spec = JobCreate.model_validate(api_job(schedule=stages, compression=compression))
    assert spec.compression.max_rank == compression.get("max_rank", 30)


def test_no_target_keeps_the_old_defaults_and_a_fixed_gamma_still_refuses_one():
    spec = JobCreate.model_validate(api_job())
    assert spec.compression.max_rank == 30 and spec.schedule[0].gamma == 0.01
    with pytest.raises(ValidationError, match="gamma 'auto'"):
        JobCreate.model_validate(
            api_job(schedule=[early_stage(steps=4, target_ratio=0.3, gamma=0.05)])
        )


def test_auto_is_refused_for_pretrained_models():
    body = api_job(
        model=model_spec("hf_bert", source=hf_dir("models/bert")),
        compression={"max_rank": "auto"},
    )
    with pytest.raises(ValidationError, match="trained from scratch"):
        JobCreate.model_validate(body)

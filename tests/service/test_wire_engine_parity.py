"""The wire schema and the engine agree on every bound and default of the sections they share.

The service validates a submission with pydantic (``api_schemas``), the worker again with the
engine's configs (:mod:`engine.configs`), so a value the wire takes must never be refused at
run time, and the other way round. Each engine field declares its bounds with ``spec``; each
wire field with ``Field(ge=..., le=...)``. This test reads both and compares them, field by
field, through the name map of :mod:`api_schemas.engine_spec`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from api_schemas import generator_limits as wire_generators
from api_schemas.engine_spec import RENAMES
from api_schemas.jobs import (
    CheckpointingSpec,
    CompressionSpec,
    DatasetSpec,
    LearningRatesSpec,
    StageSpec,
    TrainingSpec,
)
from engine.configs import bounds
from engine.data import stdlib_text
from engine.data import synthetic as engine_synthetic
from engine.data.config import DataConfig
from engine.models.tensorize import TensorizeOptions
from engine.train.config import (
    CheckpointConfig,
    CompressionConfig,
    LearningRates,
    StageConfig,
    TrainingConfig,
)


def renames(section: str) -> dict[str, str]:
    """``{wire field: engine field}`` of one engine section, from the one name map
    (unconditional entries of ``api_schemas.engine_spec.RENAMES``)."""
    return {
        r.wire.rsplit("/", 1)[1]: r.engine.rsplit(".", 1)[1]
        for r in RENAMES
        if not r.when and r.engine.startswith(f"{section}.") and r.engine.count(".") == 1
    }


# (wire model, engine class, {wire field: engine field}); fields not listed: same name
SECTIONS: list[tuple[type[BaseModel], type, dict[str, str]]] = [
    (StageSpec, StageConfig, {}),
    (LearningRatesSpec, LearningRates, {}),
    (TrainingSpec, TrainingConfig, renames("training")),
    (CheckpointingSpec, CheckpointConfig, renames("checkpoint")),
    (CompressionSpec, CompressionConfig, renames("compression")),
    (CompressionSpec, TensorizeOptions, renames("compression")),
    (DatasetSpec, DataConfig, renames("data")),
]
# where the wire is stricter than the engine on purpose: (wire model, field) -> why
STRICTER_ON_THE_WIRE = {
    # a service job always has a validation set: the fidelity guard and the report need one;
    # the engine alone may train without (n_valid 0)
    ("DatasetSpec", "n_valid"): ({"ge": 1, "le": 1_000_000}, {"ge": 0, "le": 1_000_000}),
}
# wire fields with no engine counterpart in that class (said why)
WIRE_ONLY = {
    "kind",  # a Literal on both sides: compared as choices below
    "method",  # the job's top-level method in the engine
    "layers",  # a list of patterns (length and item rules compared by the tests of each)
    "modes",  # auto / paper / explicit: the engine splits it into shapes + modes
    "target_ratio",  # CompressionSpec's default target, copied into late stages
    "device",  # auto on the wire, resolved by the worker
    "name",  # StageSpec: a pattern-checked Name on the wire, a 1-128 string in the engine
    "format",  # DatasetSpec: source + format become data.kind (choices compared below)
    "source",
}


def wire_bounds(model: type[BaseModel], name: str) -> dict[str, Any]:
    """ge / gt / le / lt of a pydantic field, from its metadata or its Annotated members."""
    info = model.model_fields[name]
    out: dict[str, Any] = {}
    metadata = list(info.metadata)
    for arg in typing.get_args(info.annotation):  # float | Literal["auto"] with an Annotated
        metadata.extend(getattr(arg, "__metadata__", ()))
        for inner in typing.get_args(arg):
            metadata.extend(getattr(inner, "__metadata__", ()))
    for item in list(metadata):
        metadata.extend(getattr(item, "metadata", ()))  # a Field(...) inside Annotated
    for item in metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(item, key, None) is not None:
                out[key] = getattr(item, key)
    return out


def engine_bounds(cls: type, name: str) -> dict[str, Any]:
    b = bounds(cls)[name]
    return {k: getattr(b, k) for k in ("ge", "gt", "le", "lt") if getattr(b, k) is not None}


def shared_fields(wire: type[BaseModel], engine: type, renames: dict[str, str]):
    names = set(bounds(engine))
    for field in wire.model_fields:
        target = renames.get(field, field)
        if target in names and field not in WIRE_ONLY:
            if (wire.__name__, field) not in STRICTER_ON_THE_WIRE:
                yield field, target


@pytest.mark.parametrize(("wire", "engine", "renames"), SECTIONS, ids=lambda x: x.__name__
                         if isinstance(x, type) else "")  # fmt: skip
def test_every_shared_bound_is_the_same_on_the_wire_and_in_the_engine(wire, engine, renames):
    compared = 0
    for field, target in shared_fields(wire, engine, renames):
        assert wire_bounds(wire, field) == engine_bounds(engine, target), (
            f"{wire.__name__}.{field} vs {engine.__name__}.{target}"
        )
        compared += 1
    assert compared >= 2, f"nothing compared for {wire.__name__}"


@pytest.mark.parametrize(("wire", "engine", "renames"), SECTIONS, ids=lambda x: x.__name__
                         if isinstance(x, type) else "")  # fmt: skip
def test_every_shared_default_is_the_same(wire, engine, renames):
    defaults = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(engine)
    }
    for field, target in shared_fields(wire, engine, renames):
        info = wire.model_fields[field]
        if info.is_required():
            continue
        got = info.get_default(call_default_factory=True)
        want = defaults[target]
        if isinstance(got, BaseModel):
            got = got.model_dump()
            want = want.to_dict()
        assert got == want, f"{wire.__name__}.{field}: wire {got!r}, engine {want!r}"


def test_choices_agree():
    assert set(typing.get_args(StageSpec.model_fields["kind"].annotation)) == set(
        bounds(StageConfig)["kind"].choices
    )
    for wire, engine, field in (
        (StageSpec, StageConfig, "lr_schedule"),
        (TrainingSpec, TrainingConfig, "precision"),
        (TrainingSpec, TrainingConfig, "cuda_graph"),
        (CompressionSpec, CompressionConfig, "penalty"),
    ):
        assert set(typing.get_args(wire.model_fields[field].annotation)) == set(
            bounds(engine)[field].choices
        ), field


def test_dataset_choices_agree():
    def literal(field: str) -> set[str]:
        args = typing.get_args(DatasetSpec.model_fields[field].annotation)  # (Literal, None)
        (lit,) = [a for a in args if a is not type(None)]
        return set(typing.get_args(lit))

    kinds = set(bounds(DataConfig)["kind"].choices)
    assert literal("format") == kinds - {"synthetic"}
    assert literal("generator") == set(bounds(DataConfig)["generator"].choices)


def test_the_default_generator_of_each_arch_is_the_engines():
    """The planner and the worker read the wire's map (torch-free); the engine generates."""
    assert wire_generators.GENERATOR_OF_ARCH == engine_synthetic.GENERATOR_OF_ARCH
    assert wire_generators.MAX_PACKAGES == stdlib_text.MAX_PACKAGES
    assert wire_generators.MAX_WEIGHT == stdlib_text.MAX_WEIGHT


def test_the_stated_differences_are_the_real_ones():
    for (model, field), (wire, engine) in STRICTER_ON_THE_WIRE.items():
        wire_model = {m.__name__: m for m, _, _ in SECTIONS}[model]
        engine_cls = next(e for m, e, _ in SECTIONS if m.__name__ == model)
        assert wire_bounds(wire_model, field) == wire
        assert engine_bounds(engine_cls, field) == engine


def test_a_drift_would_be_caught():
    """The comparison itself: a bound that differs is reported (the test is not vacuous)."""
    assert wire_bounds(TrainingSpec, "weight_decay") == {"ge": 0, "le": 1}
    assert engine_bounds(TrainingConfig, "weight_decay") == {"ge": 0, "le": 1}
    assert wire_bounds(StageSpec, "gamma") == {"ge": 0, "le": 1000}
    assert wire_bounds(StageSpec, "target_ratio") == engine_bounds(StageConfig, "target_ratio")
    assert wire_bounds(StageSpec, "target_ratio") != {"gt": 0, "le": 1}

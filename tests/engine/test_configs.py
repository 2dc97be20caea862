"""The config toolkit (engine.configs): every check against a plain expectation.

Each case gives a value and either what ``parse`` must build or the field path and the
words its ``ConfigError`` must carry; nested configs, lists and re-rooting are checked with
paths as the job's root names them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from engine.configs import Bounds, ConfigError, bounds, join, parse, spec, to_dict, validate


@dataclass(frozen=True)
class Inner:
    rank: int = spec(4, ge=1, le=64)
    name: str | None = spec(None, length=(1, 8))


@dataclass(frozen=True)
class Outer:
    steps: int = spec(10, ge=1, le=1000)
    lr: float = spec(1e-3, gt=0, lt=1)
    kind: str = spec("early", choices=("early", "late"))
    gamma: float | str = spec(0.1, ge=0, le=10, choices=("auto",))
    widths: tuple[int, ...] = spec((8,), ge=1, le=100, length=(1, 3))
    flag: bool = False
    inner: Inner = spec(factory=Inner)
    stages: tuple[Inner, ...] = ()
    version: int = spec(1, choices=(1,))

    def __post_init__(self) -> None:
        validate(self)
        if self.kind == "late" and self.steps < 2:
            raise ConfigError("steps", "must be >= 2 for a late stage")


def test_join_builds_paths_with_dots_and_indices():
    assert join("", "a") == "a" and join("a", "") == "a"
    assert join("schedule", "[1].kind") == "schedule[1].kind"
    assert join("model", "config") == "model.config"


def test_defaults_and_a_full_round_trip():
    assert parse(Outer, {}) == Outer()
    data = {
        "steps": 5,
        "lr": 0.5,
        "kind": "late",
        "gamma": "auto",
        "widths": [1, 2, 3],
        "flag": True,
        "inner": {"rank": 2, "name": "x"},
        "stages": [{"rank": 3}, {"rank": 64, "name": "abcdefgh"}],
        "version": 1,
    }
    cfg = parse(Outer, data)
    assert cfg.widths == (1, 2, 3) and cfg.inner == Inner(2, "x")
    assert cfg.stages == (Inner(3), Inner(64, "abcdefgh"))
    assert to_dict(cfg) == {**data, "stages": [{"rank": 3, "name": None}, data["stages"][1]]}
    assert parse(Outer, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"steps": 0}, "job.steps", ">= 1"),
        ({"steps": 1001}, "job.steps", "<= 1000"),
        ({"steps": True}, "job.steps", "integer"),  # a bool is never a number
        ({"steps": 2.0}, "job.steps", "integer"),
        ({"steps": "3"}, "job.steps", "integer"),  # no coercion from strings
        ({"lr": 0}, "job.lr", "> 0"),
        ({"lr": 1}, "job.lr", "< 1"),
        ({"lr": math.nan}, "job.lr", "finite"),
        ({"lr": math.inf}, "job.lr", "finite"),
        ({"kind": "middle"}, "job.kind", "one of"),
        ({"gamma": "manual"}, "job.gamma", "'auto'"),
        ({"gamma": 11}, "job.gamma", "<= 10"),
        ({"widths": []}, "job.widths", "1"),
        ({"widths": [1, 2, 3, 4]}, "job.widths", "3"),
        ({"widths": [1, 0]}, "job.widths[1]", ">= 1"),
        ({"widths": 5}, "job.widths", "list"),
        ({"flag": 1}, "job.flag", "true or false"),
        ({"inner": {"rank": 65}}, "job.inner.rank", "<= 64"),
        ({"inner": {"name": ""}}, "job.inner.name", "1"),
        ({"inner": {"name": 3}}, "job.inner.name", "must be a string"),  # str | None
        ({"inner": {"name": "x" * 9}}, "job.inner.name", "8"),
        ({"inner": {"rnk": 2}}, "job.inner.rnk", "unknown field"),
        ({"inner": None}, "job.inner", "null"),
        ({"inner": [1]}, "job.inner", "object"),
        ({"stages": [{}, {"rank": 0}]}, "job.stages[1].rank", ">= 1"),
        ({"version": 2}, "job.version", "one of"),
        ({"kind": "late", "steps": 1}, "job.steps", "late stage"),  # __post_init__, re-rooted
        ({"stepz": 1, "aa": 2}, "job.aa", "all unknown: ['aa', 'stepz']"),
    ],
)
def test_each_bad_value_names_its_field_from_the_root(data, field, words):
    with pytest.raises(ConfigError) as err:
        parse(Outer, data, "job")
    assert err.value.field == field, err.value
    assert words in err.value.message, err.value
    assert str(err.value).startswith(f"{field}: ")


def test_required_fields_and_non_mappings():
    with pytest.raises(ConfigError, match=r"^job\.version: is required$"):
        parse(Outer, {"steps": 3}, "job", require=("version",))
    assert parse(Outer, {"version": 1}, "job", require=("version",)) == Outer()
    with pytest.raises(ConfigError, match="^job: must be an object, got list$"):
        parse(Outer, [1], "job")


def test_validate_checks_a_config_built_directly():
    assert Outer(widths=[2, 3]).widths == (2, 3)  # lists become tuples
    assert Outer(inner={"rank": 7}).inner == Inner(7)  # a mapping becomes the nested config
    with pytest.raises(ConfigError, match=r"^steps: must be an integer >= 1 and <= 1000, got 0"):
        Outer(steps=0)
    with pytest.raises(ConfigError, match=r"^inner\.rank: "):
        Outer(inner={"rank": 0})


def test_under_re_roots_without_parsing_messages():
    err = ConfigError("rank", "too big: 1.5e3 (no dots here.)").under("model.config")
    assert (err.field, err.message) == ("model.config.rank", "too big: 1.5e3 (no dots here.)")
    assert ConfigError("", "whole").under("compression").field == "compression"
    assert ConfigError("[2].kind", "x").under("schedule").field == "schedule[2].kind"
    assert isinstance(err, ValueError)  # callers that catch ValueError keep working


def test_bounds_are_exposed_for_the_wire_parity_test():
    b = bounds(Outer)
    assert b["steps"] == Bounds(ge=1, le=1000)
    assert b["lr"] == Bounds(gt=0, lt=1)
    assert b["kind"].choices == ("early", "late")
    assert b["widths"].length == (1, 3)
    assert b["flag"] == Bounds()  # a plain field has no bounds

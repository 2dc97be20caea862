"""``model.config`` bounds: the service's (``api_schemas.model_limits``, checked without torch)
equal the engine's (each model config's ``spec`` fields), key by key and default by default.

A size the wire accepts must build on the worker, and the other way round; the engine's
config dataclasses are the reference, the wire's table is compared with them here.
"""

from __future__ import annotations

import dataclasses

import pytest

from api_schemas.model_limits import ARCH_LIMITS, IntLimit, ListLimit
from engine.configs import bounds
from engine.models.dlrm import DLRMConfig
from engine.models.hf_bert.config import FIXED, BertArchitecture, HFBertConfig
from engine.models.mlm import MLMConfig
from engine.models.mlp import MLPConfig
from engine.models.transformer import TransformerConfig
from service.store import model_source

ENGINE = {
    "transformer": TransformerConfig,
    "mlm": MLMConfig,
    "mlp": MLPConfig,
    "dlrm": DLRMConfig,
    "hf_bert": HFBertConfig,
}


def _default(cls: type, name: str):
    (f,) = [f for f in dataclasses.fields(cls) if f.name == name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("arch", sorted(ARCH_LIMITS))
def test_every_wire_limit_is_the_engines_bound(arch: str):
    cls = ENGINE[arch]
    engine = bounds(cls)
    assert set(ARCH_LIMITS) == set(ENGINE)
    for key, limit in ARCH_LIMITS[arch].items():
        assert key in engine, f"{arch}: model.config.{key} is not an engine field"
        b = engine[key]
        if isinstance(limit, IntLimit):
            assert (limit.low, limit.high) == (b.ge, b.le), f"{arch}.{key}"
            assert limit.default == _default(cls, key), f"{arch}.{key} default"
        else:
            assert isinstance(limit, ListLimit)
            assert (1, limit.high) == (b.ge, b.le), f"{arch}.{key} entries"
            assert (limit.min_items, limit.max_items) == b.length, f"{arch}.{key} length"
            assert tuple(limit.default) == tuple(_default(cls, key)), f"{arch}.{key} default"


@pytest.mark.parametrize("arch", ["transformer", "mlm", "mlp", "dlrm"])
def test_every_bounded_engine_size_is_limited_on_the_wire(arch: str):
    """The other direction: an integer size the engine bounds above is bounded on the wire."""
    cls = ENGINE[arch]
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    sized = {
        name
        for name, b in bounds(cls).items()
        if b.le is not None and name != "version" and "int" in str(hints[name])
    }
    assert sized <= set(ARCH_LIMITS[arch]), sorted(sized - set(ARCH_LIMITS[arch]))


def test_the_services_hf_dir_checks_are_the_engines():
    """An ``hf_dir`` model is checked at submission (service.store.model_source, torch-free)
    and built by the engine (BertArchitecture): the same config.json sizes and fixed fields."""
    engine = bounds(BertArchitecture)
    assert {k: (engine[k].ge, engine[k].le) for k in model_source.SIZES} == {
        k: (1, high) for k, high in model_source.SIZES.items()
    }
    sized = {n for n, b in engine.items() if b.le is not None and n != "layer_norm_eps"}
    assert sized == set(model_source.SIZES)
    assert model_source.FIXED == FIXED

"""One way to read a config: frozen dataclasses whose fields state their own bounds.

::

    @dataclass(frozen=True)
    class CheckpointConfig:
        every_steps: int | None = spec(None, ge=1, le=MAX_STEPS)
        keep: int = spec(2, ge=1, le=100)

    parse(CheckpointConfig, {"keep": 3}, "checkpoint")   # CheckpointConfig(None, 3)
    parse(CheckpointConfig, {"keep": 0}, "checkpoint")   # ConfigError("checkpoint.keep", ...)
    to_dict(config)                                      # JSON-safe, nested configs included
    bounds(CheckpointConfig)["keep"]                     # Bounds(ge=1, le=100)

:func:`parse` refuses keys the dataclass does not have, checks each given value against its
annotation and its :func:`spec` (an ``int`` or ``float`` is never a ``bool``; a float is
finite; a ``str`` is one of ``choices``; a ``tuple[...]`` field takes a list and checks each
element; a nested config dataclass is parsed under its own path; ``X | None`` takes null), then
builds the dataclass. Checks that involve several fields live in its ``__post_init__`` and
raise ``ConfigError(field, message)`` with the field relative to the dataclass; :func:`parse`
re-roots every error under ``path``, so the message always names the field as a path from the
job's root (``schedule[1].target_ratio``, ``model.config.hidden[2]``).

:func:`bounds` exposes the declared bounds, so a test can check that the service's wire schema
and the engine agree on every limit.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, Self, Union, get_args, get_origin, get_type_hints

__all__ = [
    "Bounds",
    "ConfigError",
    "ConfigMethods",
    "bounds",
    "join",
    "parse",
    "spec",
    "to_dict",
    "validate",
]


class ConfigError(ValueError):
    """A bad config value; ``field`` is its path from the config's root (``""``: the whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message

    def under(self, prefix: str) -> ConfigError:
        """The same error, its field seen from ``prefix`` (``model.config``)."""
        return ConfigError(join(prefix, self.field), self.message)


def join(prefix: str, field: str) -> str:
    """``join("schedule", "[1].kind") == "schedule[1].kind"``, ``join("a", "b") == "a.b"``."""
    if not prefix:
        return field
    if not field:
        return prefix
    return f"{prefix}{field}" if field.startswith("[") else f"{prefix}.{field}"


@dataclass(frozen=True)
class Bounds:
    """What a field accepts besides its type: numeric bounds, choices, a length range."""

    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    length: tuple[int, int] | None = None  # strings and sequences: (min, max) items


def spec(
    default: Any = MISSING,
    *,
    factory: Any = MISSING,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    choices: Sequence[Any] | None = None,
    length: tuple[int, int] | None = None,
    convert: Any = None,
) -> Any:
    """A dataclass field with its bounds (``metadata["bounds"]``). ``convert(value)`` reads a
    value of a form the annotation does not describe (it raises ``ConfigError("", ...)`` on a
    bad one); the result is checked against the annotation as usual."""
    b = Bounds(ge, le, gt, lt, None if choices is None else tuple(choices), length)
    md = {"bounds": b, "convert": convert}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


def bounds(cls: type) -> dict[str, Bounds]:
    """The declared bounds of every field of ``cls`` (an empty ``Bounds`` where none)."""
    return {f.name: f.metadata.get("bounds", Bounds()) for f in dataclasses.fields(cls)}


# -- reading --------------------------------------------------------------------------------
def parse(cls: type, data: object, path: str = "", *, require: Sequence[str] = ()) -> Any:
    """``cls`` from ``data`` (a mapping), checked; errors name ``path``-rooted fields.
    ``require``: fields that must be given even though they have a default (a stored
    config's ``version``)."""
    if not isinstance(data, Mapping):
        got = "null" if data is None else type(data).__name__
        raise ConfigError(path, f"must be an object, got {got}")
    for name in require:
        if name not in data:
            raise ConfigError(join(path, name), "is required")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in data if k not in fields)
    renamed = getattr(cls, "RENAMED", {})
    for old in unknown:
        if old in renamed:
            raise ConfigError(join(path, old), f"renamed to {renamed[old]}")
    if unknown:
        also = f"all unknown: {unknown}; " if len(unknown) > 1 else ""
        raise ConfigError(join(path, unknown[0]), f"unknown field ({also}known: {sorted(fields)})")
    hints = get_type_hints(cls)
    values = {}
    for key, value in data.items():
        values[key] = _field(fields[key], value, hints[key], join(path, key))
    try:
        return cls(**values)
    except ConfigError as err:
        raise err.under(path) from None


def validate(obj: Any) -> None:
    """Check every field of a config built directly (``Config(max_rank=0)``) the way
    :func:`parse` checks a mapping; lists become tuples. Call it first in ``__post_init__``."""
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name not in hints or dataclasses.is_dataclass(getattr(obj, f.name)):
            continue
        object.__setattr__(obj, f.name, _field(f, getattr(obj, f.name), hints[f.name], f.name))


def _field(f: dataclasses.Field, value: Any, hint: Any, path: str) -> Any:
    convert = f.metadata.get("convert")
    if convert is not None:
        try:
            value = convert(value)
        except ConfigError as err:
            raise err.under(path) from None
    return _check(value, hint, f.metadata.get("bounds", Bounds()), path)


def _check(value: Any, hint: Any, b: Bounds, path: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(path, "must not be null")
        options = [a for a in args if a is not type(None)]
        if str in options and isinstance(value, str):
            if b.choices is not None and value not in b.choices and len(options) > 1:
                raise ConfigError(
                    path,
                    f"must be a number{_describe(b)} or one of {list(b.choices)}, got {value!r}",
                )
            return _check(value, str, b, path)
        numeric = [a for a in options if a is not str]
        if len(numeric) == 1:
            return _check(value, numeric[0], b, path)
        if not numeric:  # str | None given something else
            return _check(value, str, b, path)
        return value
    if hint is typing.Any:
        return value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(value, args[0], b, path)
        return tuple(value)  # a fixed-form tuple: ``convert`` checked it
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be an object, got {type(value).__name__}")
        return dict(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else parse(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        return _number(value, b, path, integer=True)
    if hint is float:
        return _number(value, b, path, integer=False)
    if hint is str:
        return _string(value, b, path)
    return value


def _number(value: Any, b: Bounds, path: str, *, integer: bool) -> int | float:
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool)
    ok = ok and (integer or math.isfinite(value))
    ok = ok and (b.ge is None or value >= b.ge) and (b.le is None or value <= b.le)
    ok = ok and (b.gt is None or value > b.gt) and (b.lt is None or value < b.lt)
    if not ok:
        what = "an integer" if integer else "a finite number"
        raise ConfigError(path, f"must be {what}{_describe(b)}, got {value!r}")
    numeric = [c for c in b.choices or () if not isinstance(c, str)]
    if numeric and value not in numeric:
        raise ConfigError(path, f"must be one of {numeric}, got {value!r}")
    return int(value) if integer else float(value)


def _describe(b: Bounds) -> str:
    parts = []
    for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        v = getattr(b, name)
        if v is not None:
            parts.append(f"{sym} {_fmt(v)}")
    return (" " + " and ".join(parts)) if parts else ""


def _fmt(v: float) -> str:
    return f"{v:,}" if isinstance(v, int) and abs(v) >= 10_000 else f"{v:g}"


def _string(value: Any, b: Bounds, path: str) -> str:
    if b.choices is not None:
        if value not in b.choices:
            raise ConfigError(path, f"must be one of {list(b.choices)}, got {value!r}")
        return str(value)
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a string, got {value!r}")
    if b.length is not None and not b.length[0] <= len(value) <= b.length[1]:
        raise ConfigError(path, f"must be a string of {b.length[0]}-{b.length[1]} characters")
    return value


def _sequence(value: Any, item: Any, b: Bounds, path: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise ConfigError(path, f"must be a list, got {type(value).__name__}")
    if b.length is not None and not b.length[0] <= len(value) <= b.length[1]:
        raise ConfigError(path, f"must be a list of {b.length[0]}-{b.length[1]} items")
    each = dataclasses.replace(b, length=None)
    return tuple(_check(v, item, each, f"{path}[{i}]") for i, v in enumerate(value))


# -- writing --------------------------------------------------------------------------------
def to_dict(obj: Any) -> dict[str, Any]:
    """The config as plain JSON values (tuples as lists, nested configs as objects)."""
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class ConfigMethods:
    """``replace`` / ``to_dict`` / ``from_dict`` for a config dataclass that inherits this;
    ``REQUIRED``: fields a stored config must carry even though they have defaults;
    ``RENAMED``: old field name -> new one (:func:`parse` refuses the old name saying so)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ()
    RENAMED: ClassVar[Mapping[str, str]] = {}

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> Self:
        return parse(cls, data, path, require=cls.REQUIRED)

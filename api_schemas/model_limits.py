"""Upper bounds on the model a job may ask for (``model.config``), checked without torch.

``model.config`` is a free mapping whose keys depend on ``model.arch``; the engine checks its
types and lower bounds when the worker (or the dry-run planner) builds the model, but nothing
there stops a size that would exhaust a worker or hold the planner for its whole timeout. So
every size a user sets has a generous but finite upper bound here, per architecture, and the
*dense* parameter count of the model the config describes (sizes not set take the engine's
defaults) is capped at ``MAX_DENSE_PARAMS``: a model that may not be built dense is refused
even when each size alone is allowed.

``config_errors(arch, config)`` lists every violation as ``InitErrorDetails`` located
relative to ``model.config`` (``("d_model",)``, ``("hidden", 3)``; ``()`` for the parameter
cap); ``check_config`` raises them as one ``ValidationError``, which pydantic nests under the
validator's field, so :class:`api_schemas.jobs.ModelSpec` fails with ``model.config.d_model``
and the API answers one 422 naming ``/model/config/d_model`` (and every other failing field)
as JSON Pointers.

Sizes a job's data decides on the worker (vocabulary, classes and input width of generated or
uploaded data, Criteo table rows) are bounded by the ``dataset`` fields instead. ``hf_bert``
sizes come from the model directory's ``config.json`` (bounded in ``service.store.model_source``);
its ``model.config`` has two counts, bounded here as the engine bounds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

__all__ = [
    "ARCH_LIMITS",
    "MAX_DENSE_PARAMS",
    "IntLimit",
    "ListLimit",
    "check_config",
    "config_errors",
    "dense_params",
]

MAX_DENSE_PARAMS = 2_000_000_000  # 8 GB of fp32 weights; BERT-large is 335 M, Kaggle DLRM 540 M
MAX_VOCAB = 1 << 20
MAX_WIDTH = 16_384
MAX_FF = 65_536
MAX_LAYERS = 48
MAX_LEN = 8192
MAX_CLASSES = 65_536
MAX_HIDDEN_LAYERS = 32
MAX_TABLE_ROWS = 100_000_000  # Criteo Kaggle's largest table has 10.1 M rows
# rows per categorical feature of Criteo Kaggle (engine.models.dlrm.KAGGLE_TABLE_SIZES)
KAGGLE_TABLE_SIZES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)


@dataclass(frozen=True)
class IntLimit:
    """An integer size in ``[low, high]``; ``default``: the engine's value when unset."""

    high: int
    default: int
    low: int = 1


@dataclass(frozen=True)
class ListLimit:
    """A list of integer sizes, each in ``[1, high]``, ``min_items..max_items`` long."""

    high: int
    default: tuple[int, ...]
    max_items: int
    min_items: int = 1


def _encoder(n_layers: int) -> dict[str, IntLimit | ListLimit]:
    return {
        "vocab_size": IntLimit(MAX_VOCAB, 30522),
        "d_model": IntLimit(MAX_WIDTH, 768),
        "n_heads": IntLimit(256, 12),
        "d_ff": IntLimit(MAX_FF, 3072),
        "n_layers": IntLimit(MAX_LAYERS, n_layers),
        "max_len": IntLimit(MAX_LEN, 512),
        "type_vocab": IntLimit(64, 2),
    }


# arch -> model.config key -> bound (defaults as the engine's config dataclasses)
ARCH_LIMITS: dict[str, dict[str, IntLimit | ListLimit]] = {
    "transformer": {**_encoder(6), "num_classes": IntLimit(MAX_CLASSES, 3)},
    "mlm": _encoder(12),
    "mlp": {
        "in_features": IntLimit(1 << 20, 784),
        "num_classes": IntLimit(MAX_CLASSES, 10),
        "hidden": ListLimit(MAX_WIDTH, (512, 512), MAX_HIDDEN_LAYERS),
    },
    "dlrm": {
        "n_dense": IntLimit(MAX_WIDTH, 13),
        "embedding_dim": IntLimit(4096, 16),
        "table_sizes": ListLimit(MAX_TABLE_ROWS, KAGGLE_TABLE_SIZES, 64),
        "bottom_widths": ListLimit(MAX_WIDTH, (512, 256, 64), MAX_HIDDEN_LAYERS, 0),
        "top_widths": ListLimit(MAX_WIDTH, (512, 256), MAX_HIDDEN_LAYERS, 0),
    },
    "hf_bert": {
        "calibration_sentences": IntLimit(1_000_000, 256),
        "probe_sentences": IntLimit(100_000, 32),
    },
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _error(code: str, loc: tuple[str | int, ...], value: Any, message: str) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError(code, "{message}", {"message": message}), loc=loc, input=value
    )


def _int_error(
    key: str, loc: tuple[str | int, ...], v: Any, low: int, high: int
) -> InitErrorDetails | None:
    if _is_int(v) and low <= v <= high:
        return None
    code = "int_type" if not _is_int(v) else "less_than_equal" if v > high else "greater_than_equal"
    return _error(code, loc, v, f"{key} must be an integer in [{low}, {high}], got {v!r}")


def _check(key: str, limit: IntLimit | ListLimit, v: Any) -> list[InitErrorDetails]:
    if isinstance(limit, IntLimit):
        err = _int_error(key, (key,), v, limit.low, limit.high)
        return [err] if err else []
    if not isinstance(v, list):
        return [_error("list_type", (key,), v, f"{key} must be a list of integers")]
    if not limit.min_items <= len(v) <= limit.max_items:
        code = "too_long" if len(v) > limit.max_items else "too_short"
        return [
            _error(
                code,
                (key,),
                v,
                f"{key} must have {limit.min_items} to {limit.max_items} entries, got {len(v)}",
            )
        ]
    errors = [_int_error(f"{key}[{i}]", (key, i), x, 1, limit.high) for i, x in enumerate(v)]
    return [e for e in errors if e]


def _linears(widths: list[int]) -> int:
    """Weights and biases of the linears ``widths[0] -> widths[1] -> ...``."""
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=False))


def dense_params(arch: str, sizes: Mapping[str, Any]) -> int | None:
    """Parameters of the dense model of ``arch`` with ``sizes`` (all keys of ARCH_LIMITS[arch],
    valid), counted as the engine builds it; None for ``hf_bert`` (sized by its directory)."""
    s = sizes
    if arch in ("transformer", "mlm"):
        d, f = s["d_model"], s["d_ff"]
        embed = (s["vocab_size"] + s["max_len"] + s["type_vocab"]) * d + 2 * d  # + LayerNorm
        block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 4 * d  # attention, FFN, 2 LNs
        if arch == "transformer":  # classifier: tanh(fc1) -> fc2
            head = _linears([d, d, s["num_classes"]])
        else:  # MLM head: transform, LayerNorm, decoder to the vocabulary
            head = _linears([d, d]) + 2 * d + _linears([d, s["vocab_size"]])
        return embed + s["n_layers"] * block + head
    if arch == "mlp":
        hidden = list(s["hidden"])
        return _linears([s["in_features"], *hidden]) + _linears([hidden[-1], s["num_classes"]])
    if arch == "dlrm":
        d, tables = s["embedding_dim"], list(s["table_sizes"])
        f = 1 + len(tables)  # dot interaction: D + F (F - 1) / 2 inputs to the top MLP
        return (
            _linears([s["n_dense"], *s["bottom_widths"], d])
            + sum(tables) * d
            + _linears([d + f * (f - 1) // 2, *s["top_widths"], 1])
        )
    return None


def config_errors(arch: str, config: Mapping[str, Any]) -> list[InitErrorDetails]:
    """Every bound ``config`` breaks (locations relative to ``model.config``); keys this module
    does not bound (dropout, activation, unknown keys) are left to the engine."""
    limits = ARCH_LIMITS.get(arch, {})
    errors = [
        e for key, limit in limits.items() if key in config for e in _check(key, limit, config[key])
    ]
    if errors:
        return errors
    sizes = {key: config.get(key, limit.default) for key, limit in limits.items()}
    params = dense_params(arch, sizes)
    if params is not None and params > MAX_DENSE_PARAMS:
        return [
            _error(
                "too_large",
                (),
                dict(config),
                f"the {arch} model this config describes "
                f"has {params:,} dense parameters (unset sizes at the engine's "
                f"defaults); at most {MAX_DENSE_PARAMS:,} are accepted",
            )
        ]
    return []


def check_config(arch: str, config: Mapping[str, Any]) -> None:
    """Raise every :func:`config_errors` of ``config`` as one ``ValidationError`` (a pydantic
    validator re-raising it keeps each error's location, prefixed with its own field)."""
    errors = config_errors(arch, config)
    if errors:
        raise ValidationError.from_exception_data("model.config", errors)

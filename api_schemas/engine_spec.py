"""The one translation between the wire spec (``JobCreate``) and the engine's job config, both ways.

Forward, :func:`to_engine` (:mod:`api_schemas.spec_to_engine`): the engine job dict of a spec
(``engine.train.JobConfig.from_dict`` input), or a :class:`SpecError` naming the field the
engine cannot honour. Backward, :func:`engine_pointer` (:mod:`api_schemas.wire_names`): the JSON
Pointer into the submitted body of an engine field path, through the one table of renamed
fields, :data:`RENAMES`. Both are re-exported here, the import path of the API, the worker and
``comera run``.
"""

from __future__ import annotations

from api_schemas.spec_to_engine import (
    ENGINE_CONFIG_VERSION,
    SpecError,
    hf_model_config,
    hf_workload_config,
    package_path,
    to_engine,
)
from api_schemas.wire_names import (
    RENAMES,
    Rename,
    Spec,
    engine_pointer,
    json_pointer,
    rename_of,
    wire_has,
    wire_path,
)

__all__ = [
    "ENGINE_CONFIG_VERSION",
    "RENAMES",
    "Rename",
    "Spec",
    "SpecError",
    "engine_pointer",
    "hf_model_config",
    "hf_workload_config",
    "json_pointer",
    "package_path",
    "rename_of",
    "to_engine",
    "wire_has",
    "wire_path",
]

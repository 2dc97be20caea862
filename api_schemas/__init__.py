"""Wire types of the CoMERA service (pydantic v2; no torch, no SQLAlchemy).

Shared by ``service`` (the API), ``worker`` and ``client``.
"""

from api_schemas.artifacts import (
    AttemptPublic,
    AttemptsPublic,
    CheckpointFile,
    CheckpointManifestPublic,
    CheckpointPublic,
    CheckpointsPublic,
    CompressionReport,
    DatasetPublic,
    DatasetsPublic,
    LayerPlan,
    LayerReport,
    ValidationReport,
)
from api_schemas.common import FieldError, HealthPublic, Page, Problem
from api_schemas.job_public import JobPublic, JobsPublic
from api_schemas.jobs import (
    TERMINAL_STATES,
    CancelRequest,
    CompressionSpec,
    DatasetSpec,
    JobCreate,
    JobState,
    JobUpdate,
    ModelSpec,
    RetryRequest,
    StageSpec,
    TrainingSpec,
)
from api_schemas.series import (
    EventPublic,
    EventsPublic,
    MetricPoint,
    MetricSeries,
    MetricsPublic,
    RankPoint,
    RanksPublic,
)

__all__ = [
    "AttemptPublic",
    "AttemptsPublic",
    "CancelRequest",
    "CheckpointFile",
    "CheckpointManifestPublic",
    "CheckpointPublic",
    "CheckpointsPublic",
    "HealthPublic",
    "CompressionReport",
    "CompressionSpec",
    "DatasetPublic",
    "DatasetSpec",
    "DatasetsPublic",
    "EventPublic",
    "EventsPublic",
    "FieldError",
    "JobCreate",
    "JobPublic",
    "JobState",
    "JobUpdate",
    "JobsPublic",
    "LayerPlan",
    "LayerReport",
    "MetricPoint",
    "MetricSeries",
    "MetricsPublic",
    "ModelSpec",
    "Page",
    "Problem",
    "RankPoint",
    "RanksPublic",
    "RetryRequest",
    "StageSpec",
    "TERMINAL_STATES",
    "TrainingSpec",
    "ValidationReport",
]

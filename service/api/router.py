"""Every resource router under ``/v1`` (the template's ``api/main.py``)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.routes import checkpoints, datasets, health, jobs, series
from service.errors import problems

__all__ = ["api_router"]

# every route may answer 422 (path and query parameters are validated too): as problem+json
api_router = APIRouter(prefix="/v1", responses=problems(422))
api_router.include_router(jobs.router)
api_router.include_router(series.router)
api_router.include_router(checkpoints.router)
api_router.include_router(datasets.router)
api_router.include_router(health.router)

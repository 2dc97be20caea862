"""Every resource router under ``/v1`` (the template's ``api/main.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.api.deps import get_principal
from service.api.routes import checkpoints, datasets, health, jobs, models, series
from service.errors import problems

__all__ = ["api_router"]

# every route may answer 422 (path and query parameters are validated too): as problem+json
api_router = APIRouter(prefix="/v1", responses=problems(422))
# every resource needs an API key (401, 403 for a missing scope, 429 past the rate limit);
# the health probes do not (load balancers and orchestrators call them)
_authed = {"dependencies": [Depends(get_principal)], "responses": problems(401, 403, 429)}
api_router.include_router(jobs.router, **_authed)
api_router.include_router(series.router, **_authed)
api_router.include_router(checkpoints.router, **_authed)
api_router.include_router(datasets.router, **_authed)
api_router.include_router(models.router, **_authed)
api_router.include_router(health.router)

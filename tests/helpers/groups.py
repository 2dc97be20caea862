"""The xdist groups of ``scripts/test.sh`` (``--dist loadgroup``): the tests of one group run
one after another in one test process while the other test processes take the rest.

``PROCESSES``: a test that starts several busy processes of its own (a service stack with a
Celery worker, torchrun ranks, a launched CLI that trains). Alone on 2 cores each takes 4-22 s;
two or three of them side by side starved each other's children past the suite's 60 s limit
(a CI run saw the killed-worker and broker-restart tests at 60 s, both 17-22 s alone), so they
take turns, beside the light tests.

``CLIENT``: the tests of ``tests/client`` that share its package-scoped ``comera up`` server
and finished job; in one test process they start it once, not once per process.
"""

from __future__ import annotations

import pytest

PROCESSES = pytest.mark.xdist_group("processes")
CLIENT = pytest.mark.xdist_group("client")

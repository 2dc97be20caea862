"""The xdist groups of ``scripts/test.sh`` (``--dist loadgroup``): the tests of one group run
one after another in one test process while the other test processes take the rest.

Tests that start several busy processes of their own take 4-22 s alone on 2 cores; three of
them side by side starved each other's children past the suite's 60 s limit (a CI run saw the
killed-worker and broker-restart tests at 60 s). In two groups, at most two run at once, and
the third test process takes the light tests:

``SERVICES``: a service stack (``comera up``, the API, Celery workers, the reaper) that runs
jobs. ``LAUNCHES``: training processes launched apart from the test (torchrun ranks, the
engine's CLI, a Python without this project loading an export).

``CLIENT``: the tests of ``tests/client`` that share its package-scoped ``comera up`` server
and finished job; in one test process they start it once, not once per process. They run in
the ``services`` group: a group of their own was a third busy test process beside the other
two, and a CI run on a slow host saw the client's first test (the server's start and one job,
16 s alone) and two fault tests (10 and 21 s alone) pass 60 s.

The grouping needs pytest 9.1 (pyproject.toml): under 9.2, xdist 3.8 loses the group without a
word (``tests/test_groups.py`` fails then).
"""

from __future__ import annotations

import pytest

SERVICES = pytest.mark.xdist_group("services")
LAUNCHES = pytest.mark.xdist_group("launches")
CLIENT = SERVICES  # the same group: see above

"""The xdist groups of scripts/test.sh hold: under ``--dist loadgroup`` a grouped test's id
carries its group (``…@launches``), which is what sends the group to one test process. pytest
9.2 with xdist 3.8 dropped the suffix silently and the heavy tests ran side by side again."""

from __future__ import annotations

import pytest

from tests.helpers.groups import LAUNCHES


@LAUNCHES
def test_a_grouped_test_is_scheduled_with_its_group(request: pytest.FixtureRequest):
    if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers
        pytest.skip("not under --dist loadgroup (scripts/test.sh runs it so)")
    assert request.node.nodeid.endswith("@launches"), request.node.nodeid

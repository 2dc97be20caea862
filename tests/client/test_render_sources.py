"""``comera report`` states a mixed text split's metrics per source."""

from __future__ import annotations

from api_schemas import CompressionReport
from client.render import source_metrics
from tests.client.test_render_distributed import REPORT, report_text


def test_the_last_stages_metrics_per_source_are_listed_under_the_metrics():
    stage = {
        "stage": 0,
        "metrics": {"cosine": 0.9},
        "metrics_by_source": {"docstrings": {"cosine": 0.91}, "jokes": {"cosine": 0.7885}},
    }
    report = CompressionReport.model_validate({**REPORT, "stages": [stage]})
    assert source_metrics(report) == stage["metrics_by_source"]
    lines = [" ".join(line.split()) for line in report_text(report).splitlines()]
    assert "on docstrings cosine 0.91" in lines and "on jokes cosine 0.7885" in lines


def test_a_split_of_one_source_lists_none():
    one = CompressionReport.model_validate({**REPORT, "stages": [{"metrics": {"cosine": 0.9}}]})
    assert source_metrics(one) == {} and " on " not in report_text(one)
    assert source_metrics(CompressionReport.model_validate(REPORT)) == {}

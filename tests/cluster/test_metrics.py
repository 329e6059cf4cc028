"""The controller's metrics, scraped by a real Prometheus and read through its query API."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess, prometheus_scraping


@pytest.fixture
def prometheus(controller: ControllerProcess, tmp_path: Path) -> Iterator[str]:
    with prometheus_scraping([f"127.0.0.1:{controller.metrics_port}"], tmp_path) as url:
        yield url


def query(base: str, expression: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            data = json.loads(response.read())
    except OSError:
        return []
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def value(base: str, expression: str) -> float | None:
    result = query(base, expression)
    return float(result[0]["value"][1]) if result else None


def _errors_now(controller: ControllerProcess) -> float:
    """The controller's failed cycles so far, from its own /metrics (earlier tests of the
    session, e.g. an API server restart, may have failed some)."""
    url = f"http://127.0.0.1:{controller.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpufleet_reconcile_errors_total":
                return float(sample.value)
    raise AssertionError("gpufleet_reconcile_errors_total is not exported")


def test_metrics_scraped_by_prometheus(
    cluster: ControlPlane, scenario: Any, prometheus: str, controller: ControllerProcess
) -> None:
    errors_before = _errors_now(controller)
    s = scenario(1)
    nlp = s.team("nlp")
    s.reserve(nlp, 4)
    s.apply()
    s.job("running", nlp, "elastic", 8)
    s.wait_states({"running": "Running"})
    s.job("waiting", nlp, "elastic", 8)
    cluster.wait_until(
        lambda: value(prometheus, 'up{job="gpufleet"}') == 1,
        60,
        "Prometheus to scrape the controller",
    )
    pool = f'pool="{s.pool}"'
    cluster.wait_until(
        lambda: (
            value(prometheus, f'gpufleet_pool_gpus{{{pool},state="allocated"}}') == 8
            and value(prometheus, f'gpufleet_queue_depth{{team="{nlp}",class="elastic"}}') == 1
        ),
        60,
        "the metrics to show the allocation and the queue",
    )
    assert value(prometheus, f'gpufleet_pool_gpus{{{pool},state="idle"}}') == 0
    assert value(prometheus, f'gpufleet_pool_gpus{{{pool},state="total",gpu_type="H100"}}') == 8
    assert value(prometheus, f'gpufleet_team_gpus{{team="{nlp}",kind="borrowed"}}') == 4
    assert value(prometheus, f'gpufleet_team_gpus{{team="{nlp}",kind="reserved"}}') == 4
    assert (value(prometheus, f'gpufleet_admissions_total{{{pool},team="{nlp}"}}') or 0) >= 1
    assert (value(prometheus, "gpufleet_cluster_efficiency") or 0) > 0
    assert (value(prometheus, "gpufleet_cycle_seconds_count") or 0) > 0
    # no cycle failed while this test ran (Prometheus sees what the controller exports)
    assert (
        value(prometheus, "gpufleet_reconcile_errors_total")
        == errors_before
        == (_errors_now(controller))
    )

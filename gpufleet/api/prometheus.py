"""The server's reader of a Prometheus that scrapes the gpufleet agents: range queries over
its HTTP API, for a workload's GPU metrics (`views.workload_metrics` builds the queries and
reads the answers)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

TIMEOUT_S = 10.0
# Prometheus refuses a range query of more points than this (its own limit is 11,000)
MAX_POINTS = 10_000


class MetricsUnavailable(Exception):
    """Prometheus did not answer, or refused the query: the message says which."""


class Prometheus:
    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    def instant(self, query: str) -> list[tuple[dict[str, str], float]]:
        """Each series of `query` now: its labels and value."""
        body = self._get("/api/v1/query", {"query": query}, query)
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def series(
        self, query: str, start: datetime, end: datetime, step_s: float
    ) -> list[tuple[float, float]]:
        """The (unix time, value) points of `query`, which must yield one series (an
        aggregation), over [start, end] every `step_s` seconds; [] where it has no data."""
        params: dict[str, Any] = {
            "query": query,
            "start": start.timestamp(),
            "end": end.timestamp(),
            "step": step_s,
        }
        result = self._get("/api/v1/query_range", params, query)["data"]["result"]
        if not result:
            return []
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def each_series(
        self, queries: dict[str, str], start: datetime, end: datetime, step_s: float
    ) -> dict[str, list[tuple[float, float]]]:
        """`series` of each of `queries` (by its key) over the same window."""
        return {key: self.series(query, start, end, step_s) for key, query in queries.items()}

    def _get(self, path: str, params: dict[str, Any], query: str) -> dict[str, Any]:
        try:
            answer = self.http.get(path, params=params)
        except httpx.HTTPError as err:
            raise MetricsUnavailable(f"Prometheus at {self.url} did not answer: {err}") from None
        try:
            body: dict[str, Any] = answer.json()
        except ValueError:
            body = {}
        if answer.status_code != 200 or body.get("status") != "success":
            why = body.get("error") or answer.text[:200]
            raise MetricsUnavailable(f"Prometheus refused {query!r}: {answer.status_code} {why}")
        return body

    def close(self) -> None:
        self.http.close()

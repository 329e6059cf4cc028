"""The latest state of every series programs sent over OTLP, as Prometheus reads it: gauges
as last sent, counters and histograms cumulative (delta points are added up, as Prometheus
wants totals), each labelled with its resource's `service.name` as `service_name`. A series
not sent for `stale_after_s` is forgotten; past `max_series` new series are refused and
counted, so a program that labels by request id cannot exhaust the agent's memory."""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.otlp.names import label_name, metric_name

DELTA = 1  # AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
UNKNOWN_SERVICE = "unknown_service"
Labels = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    counts: list[float] = field(default_factory=list)  # per bucket, the last one +Inf
    total: float = 0.0  # a histogram's or summary's sum
    count: float = 0.0
    quantiles: dict[float, float] = field(default_factory=dict)
    seen: float = 0.0
    # an exponential histogram's buckets, by (sign, index) at `scale` (at most 0)
    buckets: dict[tuple[int, int], float] = field(default_factory=dict)
    scale: int = 0
    zero_bound: float = 0.0


@dataclass
class _Family:
    kind: str  # counter, gauge, histogram or summary
    help: str
    series: dict[Labels, _Series] = field(default_factory=dict)


def _text(value: Any) -> str:
    """An OTLP AnyValue as a label value."""
    which = value.WhichOneof("value")
    if which is None:
        return ""
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "array_value":
        return json.dumps([_text(v) for v in value.array_value.values])
    if which == "kvlist_value":
        return json.dumps({kv.key: _text(kv.value) for kv in value.kvlist_value.values})
    if which == "bytes_value":
        return str(value.bytes_value.hex())
    return str(getattr(value, which))


def _number(point: Any) -> float:
    return float(point.as_double if point.WhichOneof("value") == "as_double" else point.as_int)


class MetricStore:
    def __init__(self, max_series: int = 50_000, stale_after_s: float = 600.0) -> None:
        self.max_series = max_series
        self.stale_after_s = stale_after_s
        self.families: dict[str, _Family] = {}
        self.lock = threading.Lock()
        self.series_count = 0
        # data points by what became of them: stored, conflicting (a family of that name has
        # another type), over_limit (past max_series)
        self.outcomes: Counter[str] = Counter()

    def apply(self, request: Any, now: float) -> int:
        """Take in an ExportMetricsServiceRequest; the data points it held."""
        points = 0
        with self.lock:
            for resource_metrics in request.resource_metrics:
                service = UNKNOWN_SERVICE
                for kv in resource_metrics.resource.attributes:
                    if kv.key == "service.name":
                        service = _text(kv.value) or UNKNOWN_SERVICE
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        points += self._metric(metric, service, now)
        return points

    def _metric(self, metric: Any, service: str, now: float) -> int:
        which = metric.WhichOneof("data")
        if which == "gauge":
            kind, data, delta = "gauge", metric.gauge, False
        elif which == "sum":
            kind = "counter" if metric.sum.is_monotonic else "gauge"
            data, delta = metric.sum, metric.sum.aggregation_temporality == DELTA
        elif which == "histogram":
            kind, data = "histogram", metric.histogram
            delta = metric.histogram.aggregation_temporality == DELTA
        elif which == "summary":
            kind, data, delta = "summary", metric.summary, False
        elif which == "exponential_histogram":
            # served as a classic histogram: Prometheus' text format has no native ones
            kind, data = "histogram", metric.exponential_histogram
            delta = metric.exponential_histogram.aggregation_temporality == DELTA
        else:
            return 0
        name = metric_name(metric.name, metric.unit, kind)
        family = self.families.setdefault(name, _Family(kind, metric.description))
        if family.kind != kind:
            self.outcomes["conflicting"] += len(data.data_points)
            return len(data.data_points)
        for point in data.data_points:
            labels = tuple(
                sorted(
                    {
                        **{label_name(kv.key): _text(kv.value) for kv in point.attributes},
                        "service_name": service,
                    }.items()
                )
            )
            series = family.series.get(labels)
            if series is None:
                if self.series_count >= self.max_series:
                    self.outcomes["over_limit"] += 1
                    continue
                series = family.series[labels] = _Series()
                self.series_count += 1
            series.seen = now
            self.outcomes["stored"] += 1
            if kind in ("gauge", "counter"):
                value = _number(point)
                series.value = series.value + value if delta else value
            elif which == "exponential_histogram":
                _exponential(series, point, delta)
            elif kind == "histogram":
                _histogram(series, point, delta)
            else:
                series.total, series.count = point.sum, float(point.count)
                series.quantiles = {q.quantile: q.value for q in point.quantile_values}
        return len(data.data_points)

    def forget_stale(self, now: float) -> None:
        with self.lock:
            for name in list(self.families):
                family = self.families[name]
                for labels in [
                    k for k, s in family.series.items() if now - s.seen > self.stale_after_s
                ]:
                    del family.series[labels]
                    self.series_count -= 1
                if not family.series:
                    del self.families[name]

    def metrics(self) -> list[Metric]:
        """Every family as prometheus_client's Metric, for a Collector."""
        out = []
        with self.lock:
            for name, family in sorted(self.families.items()):
                metric = Metric(name, family.help or name, family.kind)
                for labels, s in family.series.items():
                    tags = dict(labels)
                    if family.kind == "counter":
                        metric.add_sample(f"{name}_total", tags, s.value)
                    elif family.kind == "gauge":
                        metric.add_sample(name, tags, s.value)
                    elif family.kind == "histogram":
                        _histogram_samples(metric, name, tags, s)
                    else:
                        for q, v in sorted(s.quantiles.items()):
                            metric.add_sample(name, {**tags, "quantile": _le(q)}, v)
                        metric.add_sample(f"{name}_sum", tags, s.total)
                        metric.add_sample(f"{name}_count", tags, s.count)
                out.append(metric)
            outcome = Metric("gpufleet_otlp_data_points", "OTLP data points taken in, by what "
                             "became of them.", "counter")  # fmt: skip
            for key in ("stored", "conflicting", "over_limit"):
                outcome.add_sample(
                    "gpufleet_otlp_data_points_total", {"outcome": key}, self.outcomes[key]
                )
            series = Metric("gpufleet_otlp_series", "Series held from OTLP.", "gauge")
            series.add_sample("gpufleet_otlp_series", {}, self.series_count)
        return [*out, outcome, series]


def _histogram(series: _Series, point: Any, delta: bool) -> None:
    bounds = tuple(point.explicit_bounds)
    # no buckets sent: every observation is in +Inf's
    counts = [float(c) for c in point.bucket_counts] or [0.0] * len(bounds) + [float(point.count)]
    if not delta or series.bounds != bounds or len(series.counts) != len(counts):
        series.bounds, series.counts = bounds, counts
        series.total, series.count = point.sum, float(point.count)
        return
    series.counts = [a + b for a, b in zip(series.counts, counts, strict=True)]
    series.total += point.sum
    series.count += float(point.count)


def _exponential(series: _Series, point: Any, delta: bool) -> None:
    """An exponential histogram point into `series.buckets`, at a scale of at most 0: buckets
    no finer than powers of two, so a histogram has few series and its bounds stay the same
    from point to point (finer buckets are merged; a coarser point merges those held)."""
    scale = min(point.scale, 0)
    if not delta or not series.buckets:
        series.buckets, series.scale = {}, scale
        series.total = series.count = 0.0
    elif scale < series.scale:  # coarser than what is held: merge what is held
        shift = series.scale - scale
        merged: dict[tuple[int, int], float] = {}
        for (sign, index), count in series.buckets.items():
            key = (sign, index >> shift if sign else 0)
            merged[key] = merged.get(key, 0.0) + count
        series.buckets, series.scale = merged, scale
    shift = point.scale - series.scale
    for sign, buckets in ((1, point.positive), (-1, point.negative)):
        for i, count in enumerate(buckets.bucket_counts):
            if count:
                key = (sign, (buckets.offset + i) >> shift)
                series.buckets[key] = series.buckets.get(key, 0.0) + float(count)
    if point.zero_count:
        series.buckets[(0, 0)] = series.buckets.get((0, 0), 0.0) + float(point.zero_count)
    series.zero_bound = max(series.zero_bound, point.zero_threshold)
    series.total += point.sum
    series.count += float(point.count)
    # as a classic histogram: upper bounds, most negative first; a bucket of index i holds
    # (base**i, base**(i + 1)], a negative one [-base**(i + 1), -base**i)
    base = 2.0 ** (2.0**-series.scale)
    ordered = sorted(series.buckets, key=lambda k: (k[0], k[1] if k[0] >= 0 else -k[1]))
    bounds = [
        -(base**index) if sign < 0 else series.zero_bound if sign == 0 else base ** (index + 1)
        for sign, index in ordered
    ]
    series.bounds = tuple(bounds)
    series.counts = [series.buckets[k] for k in ordered] + [0.0]


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _histogram_samples(metric: Metric, name: str, tags: dict[str, str], s: _Series) -> None:
    running = 0.0
    for bound, count in zip([*s.bounds, math.inf], s.counts, strict=False):
        running += count
        metric.add_sample(f"{name}_bucket", {**tags, "le": _le(bound)}, running)
    metric.add_sample(f"{name}_sum", tags, s.total)
    metric.add_sample(f"{name}_count", tags, s.count)


class StoreCollector(Collector):
    """The store's families on a prometheus_client registry (the agent's /metrics)."""

    def __init__(self, store: MetricStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield from self.store.metrics()

    def describe(self) -> Iterable[Metric]:
        return []  # families come and go: never checked at registration

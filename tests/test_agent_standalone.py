"""The standalone agent (`gpufleet agent standalone`) and its OpenTelemetry receiver: a real
OpenTelemetry SDK program sends a counter, a gauge and a histogram over OTLP/gRPC, and the
agent's /metrics serves them in Prometheus' names beside the (scripted) GPUs' metrics;
OTLP/HTTP takes protobuf, JSON and gzip; delta points add up; a full queue drops its oldest
request. Its systemd unit passes `systemd-analyze verify`; its settings file names every
setting the command reads."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import skip_unless_ci
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpufleet.agent.otlp_receiver import Ingest
from gpufleet.otlp.names import label_name, metric_name
from gpufleet.otlp.store import MetricStore, StoreCollector
from gpufleet.testing.cluster import free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Standalone:
    def __init__(self, tmp: Path) -> None:
        self.metrics, self.grpc, self.http = free_port(), free_port(), free_port()
        # a training process of this machine's user, which the scripted NVML says holds GPU 1
        self.trainer = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", "sft.py"],
            env={**os.environ, "SLURM_JOB_NAME": "llama-sft", "LOCAL_RANK": "0"},
        )
        gpus = tmp / "gpus.yaml"
        gpus.write_text(
            "gpus: 2\nbaseline: {temperatureC: 45, utilizationPct: 30}\n"
            f"processes: [{{pid: {self.trainer.pid}, gpu: 1, memoryBytes: 5000000000, "
            "smUtilPct: 70}]\n"
        )
        self.log = (tmp / "agent.log").open("wb")
        # set as the systemd unit sets them: from agent.env, no flags
        settings = {
            "GPUFLEET_AGENT_HOST_NAME": "host-1",
            "GPUFLEET_AGENT_NVML": f"fake:{gpus}",
            "GPUFLEET_AGENT_POLL_INTERVAL": "0.5",
            "GPUFLEET_AGENT_METRICS_PORT": str(self.metrics),
            "GPUFLEET_AGENT_OTLP_GRPC_PORT": str(self.grpc),
            "GPUFLEET_AGENT_OTLP_HTTP_PORT": str(self.http),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "agent", "standalone"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **settings},
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (tmp / "agent.log").read_text()
            try:
                if "gpufleet_gpu_temperature_celsius" in self.scrape_text():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("the standalone agent did not serve /metrics within 30 s")

    def scrape_text(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics}/metrics", timeout=2).text

    def until(self, wanted: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> Samples:
        """/metrics once it holds `wanted` (10 s at most: the queue's worker is quick)."""
        deadline = time.monotonic() + 10
        while True:
            found = samples(self.scrape_text())
            if all(found.get(k) == v for k, v in wanted.items()) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.trainer.kill()
        self.trainer.wait(timeout=10)
        self.log.close()


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    agent = Standalone(tmp_path)
    yield agent
    agent.stop()


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_an_opentelemetry_program_is_served_in_prometheus_names(standalone: Standalone) -> None:
    exporter = OTLPMetricExporter(endpoint=f"127.0.0.1:{standalone.grpc}", insecure=True)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "trainer"}), metric_readers=[reader]
    )
    meter = provider.get_meter("train")
    tokens = meter.create_counter("tokens.processed", unit="{token}")
    tokens.add(40, {"model": "llama-3"})
    tokens.add(2, {"model": "llama-3"})
    meter.create_gauge("batch.size").set(32, {"rank": "0"})
    step = meter.create_histogram("step.duration", unit="s")
    for seconds in (0.3, 0.7, 7.0):
        step.record(seconds)
    provider.force_flush()
    provider.shutdown()

    trainer = {"service_name": "trainer"}
    found = standalone.until({key("tokens_processed_total", model="llama-3", **trainer): 42})
    assert found[key("tokens_processed_total", model="llama-3", **trainer)] == 42
    assert found[key("batch_size", rank="0", **trainer)] == 32
    # the histogram in _bucket (cumulative, the SDK's default bounds), _sum and _count
    assert found[key("step_duration_seconds_bucket", le="0.0", **trainer)] == 0
    assert found[key("step_duration_seconds_bucket", le="5.0", **trainer)] == 2
    assert found[key("step_duration_seconds_bucket", le="10.0", **trainer)] == 3
    assert found[key("step_duration_seconds_bucket", le="+Inf", **trainer)] == 3
    assert found[key("step_duration_seconds_count", **trainer)] == 3
    assert found[key("step_duration_seconds_sum", **trainer)] == pytest.approx(8.0)
    # beside the GPUs' own metrics (the scripted NVML), on the host's name
    assert found[key("gpufleet_gpu_temperature_celsius", node="host-1", gpu="1",
                     uuid="GPU-fake-1")] == 45  # fmt: skip
    # 3 points an export (the flush's, then the shutdown's: cumulative, so alike)
    stored = found[key("gpufleet_otlp_data_points_total", outcome="stored")]
    assert stored in (3, 6)


def _request(service: str, value: int, delta: bool) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", service
    metric = resource.scope_metrics.add().metrics.add()
    metric.name, metric.unit = "http.server.requests", "{request}"
    metric.sum.is_monotonic = True
    metric.sum.aggregation_temporality = (
        metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
        if delta
        else metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    point = metric.sum.data_points.add()
    point.as_int = value
    label = point.attributes.add()
    label.key, label.value.string_value = "http.route", "/train"
    return request


def test_otlp_http_takes_protobuf_json_and_gzip_and_adds_up_delta_points(
    standalone: Standalone,
) -> None:
    url = f"http://127.0.0.1:{standalone.http}/v1/metrics"
    protobuf = {"Content-Type": "application/x-protobuf"}
    body = _request("api", 5, delta=True).SerializeToString()
    assert httpx.post(url, content=body, headers=protobuf).status_code == 200
    zipped = gzip.compress(_request("api", 7, delta=True).SerializeToString())
    sent = httpx.post(url, content=zipped, headers={**protobuf, "Content-Encoding": "gzip"})
    assert sent.status_code == 200
    as_json = json_format.MessageToJson(_request("web", 3, delta=False))
    sent = httpx.post(url, content=as_json, headers={"Content-Type": "application/json"})
    assert sent.status_code == 200 and sent.headers["content-type"] == "application/json"

    api = key("http_server_requests_total", http_route="/train", service_name="api")
    web = key("http_server_requests_total", http_route="/train", service_name="web")
    found = standalone.until({api: 12, web: 3})
    assert (found.get(api), found.get(web)) == (12, 3)  # 5 + 7: deltas add up
    wrong = httpx.post(url, content=b"\x00not protobuf", headers=protobuf)
    assert wrong.status_code == 400 and "not an OTLP metrics request" in wrong.text
    assert httpx.post(url.replace("metrics", "traces"), content=b"").status_code == 404


def test_a_full_queue_drops_the_oldest_request_and_counts_it() -> None:
    registry = CollectorRegistry()
    store = MetricStore()
    registry.register(StoreCollector(store))
    ingest = Ingest(store, 2, registry)
    for value in (1, 2, 3, 4, 5):  # no worker yet: the queue fills
        ingest.put(_request("api", value, delta=True))
    found = samples(generate_latest(registry).decode())
    assert found[key("gpufleet_otlp_dropped_total", what="requests")] == 3
    assert found[key("gpufleet_otlp_dropped_total", what="data_points")] == 3
    assert found[key("gpufleet_otlp_queue_depth")] == 2
    ingest.start()
    api = key("http_server_requests_total", http_route="/train", service_name="api")
    deadline = time.monotonic() + 10
    while samples(generate_latest(registry).decode()).get(api) != 9:  # 4 + 5: the newest
        assert time.monotonic() < deadline, "the worker did not store the queue"
        time.sleep(0.05)
    ingest.close()


def test_a_series_limit_and_stale_series_keep_the_store_bounded() -> None:
    store = MetricStore(max_series=2, stale_after_s=60)
    for service in ("a", "b", "c"):
        store.apply(_request(service, 1, delta=False), now=0.0)
    assert store.series_count == 2 and store.outcomes["over_limit"] == 1
    store.apply(_request("a", 2, delta=False), now=50.0)
    store.forget_stale(now=100.0)  # b was last sent at 0
    (family,) = store.families.values()
    assert [dict(labels)["service_name"] for labels in family.series] == ["a"]


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        ("http.server.duration", "ms", "histogram", "http_server_duration_milliseconds"),
        ("tokens.processed", "{token}", "counter", "tokens_processed"),
        ("requests_total", "", "counter", "requests"),
        ("gpu.memory.used", "By", "gauge", "gpu_memory_used_bytes"),
        ("cache.hit_ratio", "1", "gauge", "cache_hit_ratio"),
        ("throughput", "By/s", "gauge", "throughput_bytes_per_second"),
        ("queue-depth", "", "gauge", "queue_depth"),
        ("2xx.count", "", "counter", "_2xx_count"),
    ],
)
def test_names_follow_prometheus_conventions(
    name: str, unit: str, kind: str, expected: str
) -> None:
    assert metric_name(name, unit, kind) == expected


def test_attribute_keys_become_label_names() -> None:
    assert [label_name(k) for k in ("http.route", "k8s.pod.name", "9lives", "a-b")] == [
        "http_route", "k8s_pod_name", "key_9lives", "a_b",
    ]  # fmt: skip


def test_the_agent_says_what_it_holds(standalone: Standalone) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "gpufleet", "agent", "status", "-o", "json",
         f"--metrics=http://127.0.0.1:{standalone.metrics}/metrics"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["gpus"] == 2
    gone = subprocess.run(
        [sys.executable, "-m", "gpufleet", "agent", "status",
         f"--metrics=http://127.0.0.1:{free_port()}/metrics"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert gone.returncode == 1 and "the agent does not answer" in gone.stderr


def test_install_writes_a_unit_systemd_accepts_and_settings_of_every_option(
    tmp_path: Path,
) -> None:
    from typer.main import get_command

    from gpufleet.agent.systemd import SETTINGS
    from gpufleet.cli.main import app

    program = shutil.which("gpufleet") or str(Path(sys.executable).parent / "gpufleet")
    runner = CliRunner()
    done = runner.invoke(app, ["agent", "install", f"--root={tmp_path}", f"--exec={program}",
                               "--no-start"])  # fmt: skip
    assert done.exit_code == 0, done.output
    unit = tmp_path / "etc/systemd/system/gpufleet-agent.service"
    env = tmp_path / "etc/gpufleet/agent.env"
    assert f"ExecStart={program} agent standalone" in unit.read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip_unless_ci("systemd-analyze not installed: apt-get install systemd (make test does)")
    else:
        verified = subprocess.run([analyze, "verify", "--man=no", str(unit)],
                                  capture_output=True, text=True, check=False)  # fmt: skip
        assert verified.returncode == 0, verified.stderr
    # the settings file names each setting the command reads from the environment
    standalone = get_command(app).commands["agent"].commands["standalone"]  # type: ignore[attr-defined]
    read = {p.envvar for p in standalone.params if p.envvar}
    written = {line.split("=")[0] for line in env.read_text().splitlines()
               if line and not line.startswith("#")}  # fmt: skip
    not_options = {"GPUFLEET_OTLP_METRICS_QUEUE_SIZE", "GPUFLEET_AGENT_BUFFER_REPORTS"}
    assert written == {s.variable for s in SETTINGS} == read | not_options
    token = tmp_path / "etc/gpufleet/token"  # handed to the service by systemd: it must exist
    assert token.exists() and token.stat().st_mode & 0o777 == 0o600
    assert "LoadCredential=token:/etc/gpufleet/token" in unit.read_text()
    # an edited settings file is kept by a second install, removed by uninstall --purge
    env.write_text(env.read_text() + "GPUFLEET_AGENT_METRICS_PORT=9500\n")
    again = runner.invoke(app, ["agent", "install", f"--root={tmp_path}", f"--exec={program}",
                                "--no-start"])  # fmt: skip
    assert again.exit_code == 0 and "kept" in again.output and "9500" in env.read_text()
    wrong = runner.invoke(app, ["agent", "install", f"--root={tmp_path}", "--exec=gpufleet"])
    assert wrong.exit_code == 1 and "not an executable file" in wrong.output
    gone = runner.invoke(app, ["agent", "uninstall", f"--root={tmp_path}", "--purge"])
    assert gone.exit_code == 0 and not unit.exists() and not env.exists() and not token.exists()


def test_the_standalone_agent_starts_without_the_rest_of_the_cli() -> None:
    """A host's long-running service: none of the CLI's heavy imports (Kubernetes, SQLAlchemy,
    FastAPI, the cloud SDKs) may come with it (benchmarks/otlp_ingest.py measures its RSS)."""
    probe = (
        "import sys\n"
        "sys.argv = ['gpufleet', 'agent', 'standalone', '--help']\n"
        "from gpufleet.cli.entry import run\n"
        "try:\n    run()\nexcept SystemExit:\n    pass\n"
        "heavy = ('kubernetes', 'sqlalchemy', 'fastapi', 'boto3', 'google.cloud', 'kopf')\n"
        "print(sorted({m for m in sys.modules for h in heavy if m == h or m.startswith(h + '.')}))"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True)  # fmt: skip
    assert "--otlp-grpc-port" in shown.stdout  # its help was printed
    assert shown.stdout.strip().splitlines()[-1] == "[]"


def test_each_gpu_process_is_named_with_its_user_framework_and_workload(
    standalone: Standalone,
) -> None:
    import getpass

    found = samples(standalone.scrape_text())
    held = {k: v for k, v in found.items() if k[0] == "gpufleet_process_gpu_memory_bytes"}
    (labels,) = [dict(k[1]) for k in held]
    assert labels == {
        "node": "host-1", "gpu": "1", "uuid": "GPU-fake-1", "pid": str(standalone.trainer.pid),
        "user": getpass.getuser(), "command": Path(sys.executable).name,
        "framework": "pytorch", "workload": "llama-sft",
    }  # fmt: skip
    assert list(held.values()) == [5e9]
    busy = key("gpufleet_process_gpu_utilization_ratio", **labels)
    assert found[busy] == pytest.approx(0.7)
    # and the host's own metrics
    assert found[key("gpufleet_host_memory_total_bytes", node="host-1")] > 0
    assert found[key("gpufleet_host_disk_total_bytes", node="host-1", mount="/")] > 0
    assert 0 <= found[key("gpufleet_host_cpu_utilization_ratio", node="host-1")] <= 1


@pytest.mark.parametrize(
    ("cmdline", "environ", "framework", "workload"),
    [
        (["/usr/bin/torchrun", "--nproc-per-node=8", "train.py"], {}, "pytorch", "train"),
        (["python", "-m", "vllm.entrypoints.api_server"], {}, "vllm",
         "vllm.entrypoints.api_server"),
        (["deepspeed", "--num_gpus=8", "pretrain.py"], {"SLURM_JOB_NAME": "gpt-pt"}, "deepspeed",
         "gpt-pt"),
        (["ray::TrainWorker.train"], {"RAY_JOB_ID": "02000000"}, "ray", "02000000"),
        (["python3", "eval.py"], {}, "python", "eval"),
        (["python3", "serve.py"], {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "serve-7d9"},
         "python", "serve-7d9"),
        (["/opt/bin/llama-server", "-m", "x.gguf"], {}, "llama-server", "llama-server"),
    ],
)  # fmt: skip
def test_a_process_is_named_from_its_command_line_and_environment(
    cmdline: list[str], environ: dict[str, str], framework: str, workload: str
) -> None:
    from gpufleet.hosts.processes import recognise

    found = recognise(cmdline, environ)
    assert (found.framework, found.workload) == (framework, workload)


def test_an_exponential_histogram_is_served_in_powers_of_two(standalone: Standalone) -> None:
    """The SDK's base-2 exponential histogram (here at its finest scale, 20) becomes a classic
    histogram with buckets no finer than powers of two, its zero bucket included."""
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    exporter = OTLPMetricExporter(endpoint=f"127.0.0.1:{standalone.grpc}", insecure=True)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "server"}), metric_readers=[reader],
        views=[View(instrument_name="latency",
                    aggregation=ExponentialBucketHistogramAggregation())],
    )  # fmt: skip
    latency = provider.get_meter("serve").create_histogram("latency", unit="s")
    for seconds in (0.3, 0.7, 7.0, 0.0):
        latency.record(seconds)
    provider.force_flush()
    provider.shutdown()
    server = {"service_name": "server"}
    found = standalone.until({key("latency_seconds_count", **server): 4})
    buckets = {
        dict(labels)["le"]: value
        for (name, labels), value in found.items()
        if name == "latency_seconds_bucket"
    }
    assert buckets == {
        "0.0": 1,  # the zero bucket
        "0.5": 2,  # 0.3 in (0.25, 0.5]
        "1.0": 3,  # 0.7 in (0.5, 1]
        "8.0": 4,  # 7.0 in (4, 8]
        "+Inf": 4,
    }
    assert found[key("latency_seconds_sum", **server)] == pytest.approx(8.0)


def test_exponential_delta_points_add_up_and_a_coarser_one_merges_what_is_held() -> None:
    store = MetricStore()
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "queue.wait"
    histogram = metric.exponential_histogram
    histogram.aggregation_temporality = 1  # delta
    fine = histogram.data_points.add(scale=1, count=2, sum=3.0)  # base sqrt(2)
    fine.positive.offset = 1  # (1.41, 2] and (2, 2.83]: at scale 0, (1, 2] and (2, 4]
    fine.positive.bucket_counts.extend([1, 1])
    coarse = histogram.data_points.add(scale=-1, count=2, sum=8.0)  # base 4
    coarse.positive.offset = 1  # (4, 16]
    coarse.positive.bucket_counts.extend([1])
    coarse.negative.offset = 0  # [-4, -1)
    coarse.negative.bucket_counts.extend([1])
    store.apply(request, 0.0)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    found = samples(generate_latest(registry).decode())
    service = {"service_name": "unknown_service"}
    assert found[key("queue_wait_bucket", le="-1.0", **service)] == 1  # the negative one
    assert found[key("queue_wait_bucket", le="4.0", **service)] == 3  # (1, 4]: both fine ones
    assert found[key("queue_wait_bucket", le="16.0", **service)] == 4
    assert found[key("queue_wait_bucket", le="+Inf", **service)] == 4
    assert found[key("queue_wait_count", **service)] == 4
    assert found[key("queue_wait_sum", **service)] == 11.0

"""OTLP ingest of the standalone agent. Prints JSON; not a timed test.

    python benchmarks/otlp_ingest.py           # 20 s flood, 60 s at the brief's load
    python benchmarks/otlp_ingest.py --quick   # a few seconds of each (CI smoke)

Two runs of the real `gpufleet agent standalone` (scripted NVML, 8 GPUs), measured from its
own /proc counters:
- flood: export requests over OTLP/HTTP (protobuf) as fast as 4 client threads send them, each
  of 10 services x 100 data points (counters, gauges, histograms): data points stored per second
  of the agent's CPU time (its user + system: the ingest cost on one core, HTTP included), and
  per second of wall time;
- the brief's load: 8 GPUs polled every 5 s and 10 services exporting 40 data points every
  10 s: the agent's CPU share of one core and its RSS at the end; then the same with the
  upload on (`--server`: a report every poll, gzipped, to a local receiver that answers as the
  server does).
Acceptance (issue 48): >= 50,000 points per CPU-second; < 2 % of a core and < 100 MiB RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.testing.cluster import free_port

TICKS = os.sysconf("SC_CLK_TCK")


def request(service: str, metrics: int, now_ns: int, step: int) -> bytes:
    """One export of `service`: `metrics` metrics of 1 point each, a third counters, a third
    gauges, a third histograms (10 bounds), labelled as a trainer's would be."""
    out = ExportMetricsServiceRequest()
    resource = out.resource_metrics.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", service
    scope = resource.scope_metrics.add()
    for i in range(metrics):
        metric = scope.metrics.add()
        metric.name = f"train.metric_{i}"
        if i % 3 == 0:
            metric.sum.is_monotonic = True
            metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
            point: Any = metric.sum.data_points.add()
            point.as_int = step * 10 + i
        elif i % 3 == 1:
            point = metric.gauge.data_points.add()
            point.as_double = step * 0.5 + i
        else:
            metric.histogram.aggregation_temporality = (
                metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
            )
            point = metric.histogram.data_points.add()
            point.explicit_bounds.extend([0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])
            point.bucket_counts.extend([step] * 11)
            point.count, point.sum = step * 11, step * 3.5
        point.time_unix_nano = now_ns
        for key, value in (("rank", str(i % 8)), ("model", "llama-3-8b")):
            label = point.attributes.add()
            label.key, label.value.string_value = key, value
    body: bytes = out.SerializeToString()
    return body


class Receiver:
    """Where the reporting agent sends its reports: answers each as the server does (200 with
    what it took), keeping nothing; the agent's own cost is what is measured."""

    def __init__(self) -> None:
        receiver = self
        self.reports = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
                taken = len(json.loads(body)["reports"])
                receiver.reports += taken
                answer = json.dumps({"accepted": taken, "duplicates": 0, "lastSequence": 0})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Agent:
    def __init__(self, work: Path, server: str | None = None) -> None:
        self.metrics, self.http = free_port(), free_port()
        gpus = work / "gpus.yaml"
        gpus.write_text("gpus: 8\nbaseline: {temperatureC: 45, utilizationPct: 60}\n")
        upload: list[str] = []
        if server is not None:
            (work / "token").write_text("bench-token\n")
            upload = [f"--server={server}", f"--token-file={work / 'token'}",
                      f"--buffer-dir={work / 'buffer'}", "--slurm-drain=off"]  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "agent", "standalone", "--host-name=bench",
             f"--nvml=fake:{gpus}", "--poll-interval=5", f"--metrics-port={self.metrics}",
             "--otlp-grpc-port=0", f"--otlp-http-port={self.http}", *upload],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url_metrics, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the standalone agent did not start")

    @property
    def url_metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics}/metrics"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def sample(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url_metrics, timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        return 0.0

    def stored(self) -> float:
        return self.sample("gpufleet_otlp_data_points_total", outcome="stored")

    def dropped(self) -> float:
        return self.sample("gpufleet_otlp_dropped_total", what="requests")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def flood(agent: Agent, seconds: float, threads: int = 4) -> dict[str, Any]:
    bodies = [request(f"svc-{s}", 100, time.time_ns(), 1) for s in range(10)]
    url = f"http://127.0.0.1:{agent.http}/v1/metrics"
    stop = time.monotonic() + seconds
    sent = [0] * threads

    def send(index: int) -> None:
        with httpx.Client(headers={"Content-Type": "application/x-protobuf"}) as client:
            while time.monotonic() < stop:
                client.post(url, content=bodies[sent[index] % len(bodies)])
                sent[index] += 1

    before_cpu, before_stored, started = agent.cpu_s(), agent.stored(), time.monotonic()
    workers = [threading.Thread(target=send, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    deadline = time.monotonic() + 30  # the queue drains
    while agent.sample("gpufleet_otlp_queue_depth") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    wall = time.monotonic() - started
    cpu = agent.cpu_s() - before_cpu
    points = agent.stored() - before_stored
    return {
        "requests_sent": sum(sent),
        "points_stored": points,
        "requests_dropped_by_a_full_queue": agent.dropped(),
        "agent_cpu_seconds": round(cpu, 2),
        "wall_seconds": round(wall, 2),
        "points_per_cpu_second": round(points / cpu) if cpu else None,
        "points_per_wall_second": round(points / wall),
    }


def steady(agent: Agent, seconds: float, interval: float = 10.0) -> dict[str, Any]:
    url = f"http://127.0.0.1:{agent.http}/v1/metrics"
    before_cpu, started = agent.cpu_s(), time.monotonic()
    step = 0
    with httpx.Client(headers={"Content-Type": "application/x-protobuf"}) as client:
        while time.monotonic() - started < seconds:
            step += 1
            for s in range(10):
                client.post(url, content=request(f"svc-{s}", 40, time.time_ns(), step))
            time.sleep(max(0.0, started + step * interval - time.monotonic()))
    wall = time.monotonic() - started
    cpu = agent.cpu_s() - before_cpu
    return {
        "seconds": round(wall, 1),
        "services": 10,
        "points_per_export": 40,
        "export_interval_seconds": interval,
        "gpus": 8,
        "agent_cpu_share_of_a_core": round(cpu / wall, 4),
        "agent_rss_mib": round(agent.rss_mib(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds each (CI smoke)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        agent = Agent(Path(work))
        try:
            flooded = flood(agent, 3 if args.quick else 20)
            # the brief's load on an agent that has not been flooded: a fresh one
            agent.stop()
            agent = Agent(Path(work))
            time.sleep(2 if args.quick else 10)  # its start-up is not its steady state
            load = steady(agent, 12 if args.quick else 60, 4 if args.quick else 10)
            # the same load with the upload on: a report to a server every poll
            agent.stop()
            receiver = Receiver()
            agent = Agent(Path(work), receiver.url)
            time.sleep(2 if args.quick else 10)
            reporting = steady(agent, 12 if args.quick else 60, 4 if args.quick else 10)
            reporting["reports_taken_by_the_server"] = receiver.reports
            receiver.server.shutdown()
        finally:
            agent.stop()
    per_cpu = flooded["points_per_cpu_second"] or 0
    print(json.dumps({
        "benchmark": "otlp_ingest",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "flood": flooded,
        "brief_load": load,
        "brief_load_reporting_to_a_server": reporting,
        "acceptance": {
            "points_per_cpu_second_at_least_50000": per_cpu >= 50_000,
            "cpu_share_under_2_percent": load["agent_cpu_share_of_a_core"] < 0.02,
            "rss_under_100_mib": load["agent_rss_mib"] < 100,
            "reporting_cpu_share_under_2_percent": reporting["agent_cpu_share_of_a_core"] < 0.02,
            "reporting_rss_under_100_mib": reporting["agent_rss_mib"] < 100,
        },
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

"""`gpufleet agent standalone`: the agent of a GPU host without Kubernetes. A long-running
service, so it starts with only what it needs: the console script (`entry.py`) runs it without
the rest of the CLI, whose imports (Kubernetes, SQLAlchemy, FastAPI, ...) would more than
double its memory."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import typer

from gpufleet.cli.output import err_console, fail, guarded


def backend_of(spec: str) -> Any:
    """The NVML backend `--nvml` names: the real library, or a scripted timeline."""
    from gpufleet.agent.backend import NVMLError
    from gpufleet.agent.fake import FakeBackend, TimelineError

    if spec.startswith("fake:"):
        try:
            return FakeBackend(spec.removeprefix("fake:"))
        except TimelineError as err:
            raise fail(str(err)) from None
    if spec != "nvml":
        raise fail(f"--nvml {spec!r}: use nvml or fake:FILE.yaml")
    try:
        from gpufleet.agent.nvml import NVMLBackend

        return NVMLBackend()
    except NVMLError as err:
        raise fail(str(err)) from None


def standalone(
    host_name: str = typer.Option(
        "",
        "--host-name",
        envvar="GPUFLEET_AGENT_HOST_NAME",
        help="This host, as its metrics name it (default: its hostname).",
    ),
    nvml: str = typer.Option(
        "nvml", "--nvml", envvar="GPUFLEET_AGENT_NVML", help="nvml, or fake:FILE.yaml."
    ),
    poll_interval: float = typer.Option(
        5.0, "--poll-interval", envvar="GPUFLEET_AGENT_POLL_INTERVAL", help="Seconds between polls."
    ),
    metrics_port: int = typer.Option(
        9402,
        "--metrics-port",
        envvar="GPUFLEET_AGENT_METRICS_PORT",
        help="/metrics (GPU and OTLP metrics) and /healthz.",
    ),
    metrics_host: str = typer.Option(
        "0.0.0.0", "--metrics-host", envvar="GPUFLEET_AGENT_METRICS_HOST", help="Where it listens."
    ),
    dcgm_exporter: str | None = typer.Option(
        None,
        "--dcgm-exporter",
        envvar="GPUFLEET_AGENT_DCGM_EXPORTER",
        help="DCGM exporter /metrics URL, for the GPU Usage metric.",
    ),
    otlp_host: str = typer.Option(
        "127.0.0.1",
        "--otlp-host",
        envvar="GPUFLEET_AGENT_OTLP_HOST",
        help="Where the OTLP receiver listens: this host's programs only by default; 0.0.0.0 "
        "takes metrics from anywhere (unauthenticated: keep it behind a firewall).",
    ),
    otlp_grpc_port: int = typer.Option(
        4317, "--otlp-grpc-port", envvar="GPUFLEET_AGENT_OTLP_GRPC_PORT", help="0: none."
    ),
    otlp_http_port: int = typer.Option(
        4318, "--otlp-http-port", envvar="GPUFLEET_AGENT_OTLP_HTTP_PORT", help="0: none."
    ),
) -> None:
    """The agent for a GPU host without Kubernetes (a cloud GPU VM, a Slurm or bare-metal
    node): the node agent's GPU checks and metrics through NVML, the processes that hold each
    GPU (user, command, framework, workload), the host's CPU, memory and disk, and an
    OpenTelemetry receiver (OTLP metrics over gRPC and HTTP) whose metrics it serves beside
    the GPUs' at /metrics, in Prometheus' names, each labelled with its program's
    service_name. The queue
    of OTLP requests holds $GPUFLEET_OTLP_METRICS_QUEUE_SIZE (default 1000); a full one drops
    the oldest and counts it (gpufleet_otlp_dropped_total). docs/agent-standalone.md.

    Example (a scripted GPU, no GPU needed):

      gpufleet agent standalone --nvml fake:examples/faults/thermal.yaml
    """
    import socket

    from prometheus_client import CollectorRegistry

    from gpufleet.agent.host import HostCollector
    from gpufleet.agent.metrics import Metrics
    from gpufleet.agent.otlp_receiver import Ingest, OtlpReceiver, queue_size
    from gpufleet.agent.processes import ProcessNames
    from gpufleet.agent.runner import Agent
    from gpufleet.health.checks import HealthMonitor, Thresholds
    from gpufleet.metrics_server import PortInUse, serve
    from gpufleet.otlp.store import MetricStore, StoreCollector

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        size = queue_size()
    except ValueError as err:
        raise fail(str(err)) from None
    name = host_name or socket.gethostname()
    backend = backend_of(nvml)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = MetricStore()
    registry.register(StoreCollector(store))
    registry.register(HostCollector(name))
    agent = Agent(
        name, backend, HealthMonitor(Thresholds()), None, metrics, poll_interval, dcgm_exporter,
        describe=ProcessNames(),
    )  # fmt: skip
    try:
        receiver = OtlpReceiver(Ingest(store, size, registry), otlp_host, otlp_grpc_port,
                                otlp_http_port)  # fmt: skip
        serve(metrics_port, metrics_host, agent.health_problem, registry)
    except (OSError, PortInUse) as err:
        raise fail(f"{err}: stop what holds the port, or give another one") from None
    receiver.start()
    err_console.print(
        f"gpufleet agent standalone on {name}: /metrics on {metrics_host}:{metrics_port}, "
        f"OTLP gRPC {otlp_host}:{otlp_grpc_port or '-'}, HTTP {otlp_host}:{otlp_http_port or '-'}"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def forget_stale() -> None:
        while not stop.wait(60):
            store.forget_stale(time.monotonic())

    threading.Thread(target=forget_stale, name="gpufleet-otlp-stale", daemon=True).start()
    try:
        agent.run(stop)
    finally:
        receiver.close()


def run_alone(args: list[str]) -> None:
    """`gpufleet agent standalone ARGS`, as the full CLI would run it."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]})  # fmt: skip
    app.command()(standalone)
    guarded(lambda: app(args=args, prog_name="gpufleet agent standalone"))

"""`gpufleet agent standalone`: the agent of a GPU host without Kubernetes. A long-running
service, so it starts with only what it needs: the console script (`entry.py`) runs it without
the rest of the CLI, whose imports (Kubernetes, SQLAlchemy, FastAPI, ...) would more than
double its memory."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
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
    server: str | None = typer.Option(
        None,
        "--server",
        envvar="GPUFLEET_SERVER",
        help="The gpufleet server to report to (https://gpufleet.example.com); none: serve "
        "/metrics only.",
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        envvar="GPUFLEET_AGENT_TOKEN_FILE",
        help="The host's token (`gpufleet hosts token NAME --write FILE`), read at each upload "
        "(default: the credential `token` systemd hands over, from /etc/gpufleet/token).",
    ),
    ca_cert: Path | None = typer.Option(
        None, "--ca-cert", envvar="GPUFLEET_CA_CERT", help="The server's CA, if not public."
    ),
    buffer_dir: Path | None = typer.Option(
        None,
        "--buffer-dir",
        envvar="GPUFLEET_AGENT_BUFFER_DIR",
        help="Where reports wait while the server is away (default: systemd's "
        "$STATE_DIRECTORY, else ~/.cache/gpufleet/agent).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Report nothing to the server, even with --server."
    ),
    slurm_drain: str = typer.Option(
        "auto",
        "--slurm-drain",
        envvar="GPUFLEET_AGENT_SLURM_DRAIN",
        help="auto (where scontrol is found), on or off: drain the host's Slurm node while "
        "gpufleet quarantines the host, resume it after (a drain of its own only).",
    ),
    slurm_node: str = typer.Option(
        "",
        "--slurm-node",
        envvar="GPUFLEET_AGENT_SLURM_NODE",
        help="The host's Slurm node name (default: the host name).",
    ),
) -> None:
    """The agent for a GPU host without Kubernetes (a cloud GPU VM, a Slurm or bare-metal
    node): the node agent's GPU checks and metrics through NVML, the processes that hold each
    GPU (user, command, framework, workload), the host's CPU, memory and disk, and an
    OpenTelemetry receiver (OTLP metrics over gRPC and HTTP) whose metrics it serves beside
    the GPUs' at /metrics, in Prometheus' names, each labelled with its program's
    service_name. The queue
    of OTLP requests holds $GPUFLEET_OTLP_METRICS_QUEUE_SIZE (default 1000); a full one drops
    the oldest and counts it (gpufleet_otlp_dropped_total).

    With --server it reports to gpufleet server every poll (the host then shows in `gpufleet
    hosts list`, the API and the dashboard). Reports wait on disk while the server is away:
    $GPUFLEET_AGENT_BUFFER_REPORTS of them (default 8640, 12 h at a 5 s poll), then the oldest
    are dropped and counted (gpufleet_agent_reports_total{outcome="dropped"}).
    docs/agent-standalone.md.

    Examples (a scripted GPU, no GPU needed):

      gpufleet agent standalone --nvml fake:examples/faults/thermal.yaml

      gpufleet agent standalone --server https://gpufleet.example.com --token-file TOKEN
    """
    import os
    import socket

    from prometheus_client import CollectorRegistry

    from gpufleet.agent.host import HostCollector
    from gpufleet.agent.metrics import Metrics
    from gpufleet.agent.otlp_receiver import Ingest, OtlpReceiver, queue_size
    from gpufleet.agent.processes import ProcessNames
    from gpufleet.agent.runner import Agent
    from gpufleet.agent.upload import Uploader
    from gpufleet.health.checks import HealthMonitor, Thresholds
    from gpufleet.metrics_server import PortInUse, serve
    from gpufleet.otlp.store import MetricStore, StoreCollector

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        size = queue_size()
    except ValueError as err:
        raise fail(str(err)) from None
    name = host_name or socket.gethostname()
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")  # systemd's (agent install's unit)
    if token_file is None and credentials:
        token_file = Path(credentials) / "token"
    if server and not dry_run and token_file is None:
        raise fail("--server needs --token-file: make one with `gpufleet hosts token HOST`")
    backend = backend_of(nvml)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = MetricStore()
    registry.register(StoreCollector(store))
    registry.register(HostCollector(name))
    uploader: Uploader | None = None
    if server and not dry_run and token_file is not None:
        follow = slurm_of(slurm_drain, slurm_node or name, registry)
        uploader = uploader_of(server, name, token_file, ca_cert, buffer_dir, registry,
                               poll_interval, follow)  # fmt: skip
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
    stop = threading.Event()
    receiver.start()
    err_console.print(
        f"gpufleet agent standalone on {name}: /metrics on {metrics_host}:{metrics_port}, "
        f"OTLP gRPC {otlp_host}:{otlp_grpc_port or '-'}, HTTP {otlp_host}:{otlp_http_port or '-'}"
    )
    if uploader is not None:
        uploader.start(stop)
        err_console.print(f"reporting to {server}; reports wait in {uploader.buffer.folder}")
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


def uploader_of(
    server: str,
    host: str,
    token_file: Path,
    ca_cert: Path | None,
    buffer_dir: Path | None,
    registry: Any,
    interval_s: float,
    follow: Any = None,
) -> Any:
    """The upload to `server`, its buffer opened (a clear failure when it cannot be)."""
    import os
    import re

    from gpufleet import __version__
    from gpufleet.agent.upload import BufferUnusable, ReportBuffer, Server, Uploader, buffer_size
    from gpufleet.model.api import NAME_PATTERN

    if not server.startswith(("http://", "https://")):
        raise fail(f"--server {server}: give its URL, https://HOST")
    if not re.fullmatch(NAME_PATTERN, host):
        raise fail(
            f"host name {host!r} is not a Kubernetes object name (the server keeps each host "
            "as one): give --host-name with lower-case letters, digits, '-' and '.'"
        )
    try:
        given = token_file.read_text().strip()
    except OSError as err:
        raise fail(f"--token-file {token_file}: {err.strerror}") from None
    if not given:
        raise fail(f"--token-file {token_file} is empty: `gpufleet hosts token {host} --write "
                   "FILE` writes one")  # fmt: skip
    if ca_cert is not None and not ca_cert.is_file():
        raise fail(f"--ca-cert {ca_cert}: no such file (a PEM certificate)")
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    folder = buffer_dir or (
        Path(state) / "buffer" if state else Path.home() / ".cache" / "gpufleet" / "agent"
    )
    try:
        buffer = ReportBuffer(folder, buffer_size())
    except (BufferUnusable, ValueError) as err:
        raise fail(str(err)) from None

    def token() -> str:
        return token_file.read_text().strip()

    target = Server(server, host, token, str(ca_cert) if ca_cert else None)
    return Uploader(buffer, target, registry, interval_s, __version__, follow=follow)


def slurm_of(mode: str, node: str, registry: Any) -> Any:
    """The drain of the host's Slurm node that `--slurm-drain` asks for, or None."""
    from gpufleet.agent.slurm import SlurmDrain, scontrol_present

    if mode not in ("auto", "on", "off"):
        raise fail(f"--slurm-drain {mode!r}: use auto, on or off")
    if mode == "off" or (mode == "auto" and not scontrol_present()):
        return None
    if not scontrol_present():
        raise fail("--slurm-drain on: scontrol is not on PATH (install slurm-client)")
    return SlurmDrain(node, registry).follow


def run_alone(args: list[str]) -> None:
    """`gpufleet agent standalone ARGS`, as the full CLI would run it."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]})  # fmt: skip
    app.command()(standalone)
    guarded(lambda: app(args=args, prog_name="gpufleet agent standalone"))

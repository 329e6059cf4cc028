"""`gpufleet agent run|check` (the node agent) and `gpufleet nodes` (quarantine by hand)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.live import kube_client
from gpufleet.cli.output import OutputFormat, console, err_console, fail, print_structured
from gpufleet.cli.standalone import backend_of as _backend
from gpufleet.cli.standalone import standalone
from gpufleet.health.checks import HealthMonitor, Thresholds
from gpufleet.model.api import GROUP, VERSION, FleetPolicySpec
from gpufleet.model.keys import (
    GPU_HEALTHY_CONDITION,
    HEALTH_BREAKER,
    QUARANTINE_ESCALATED_ANNOTATION,
    QUARANTINE_REASON_ANNOTATION,
    QUARANTINE_TAINT,
    QUARANTINED_AT_ANNOTATION,
    RELEASE_ANNOTATION,
)

agent_app = typer.Typer(help="The per-node GPU health agent.", no_args_is_help=True)
nodes_app = typer.Typer(help="GPU nodes: health and quarantine.", no_args_is_help=True)
KUBECONFIG = typer.Option(None, "--kubeconfig", help="Cluster; default $KUBECONFIG or in-cluster.")
NVML = typer.Option(
    "nvml",
    "--nvml",
    help="nvml (the real library), or fake:FILE.yaml to play a scripted timeline "
    "(docs/health.md, examples/faults/).",
)


def _core(kubeconfig: Path | None) -> Any:
    return kube_client(kubeconfig)


def _policy(client: Any) -> FleetPolicySpec:
    """The health thresholds of the cluster's FleetPolicies (defaults when there is none)."""
    from gpufleet.kube.calls import API_TIMEOUT_S  # imports the client: only here
    from gpufleet.model.fleet import fleet_from_objects

    try:
        listed = client.CustomObjectsApi().list_cluster_custom_object(
            GROUP, VERSION, "fleetpolicies", _request_timeout=API_TIMEOUT_S
        )
    except Exception as err:  # API refused or unreachable: check the GPUs all the same
        logging.getLogger("gpufleet.agent").warning(
            "could not read the FleetPolicy (%s); using the default health thresholds", err
        )
        return FleetPolicySpec()
    return fleet_from_objects(listed.get("items", [])).fleet.policy


@agent_app.command("run")
def run(
    node_name: str = typer.Option(
        os.environ.get("NODE_NAME", ""), "--node-name", help="This node (default $NODE_NAME)."
    ),
    nvml: str = NVML,
    kubeconfig: Path | None = KUBECONFIG,
    poll_interval: float = typer.Option(5.0, "--poll-interval", help="Seconds between polls."),
    metrics_port: int = typer.Option(
        9402, "--metrics-port", help="/metrics and /healthz (the liveness probe); 0: none."
    ),
    heartbeat: float = typer.Option(
        60.0,
        "--heartbeat",
        help="Seconds between rewrites of the GPUHealthy condition's lastHeartbeatTime when "
        "nothing changed: the health controller treats a node whose heartbeat is older than "
        "FleetPolicy health.agentTimeout as unknown.",
    ),
    dcgm_exporter: str | None = typer.Option(
        None, "--dcgm-exporter", help="DCGM exporter /metrics URL, for the GPU Usage metric."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Log findings; write nothing."),
) -> None:
    """Check every GPU of this node continuously: NVML events (Xid, double-bit ECC, GPU lost,
    recovery action) and a poll of its counters. Fatal findings set the node condition
    GPUHealthy=False (the health controller then quarantines the node); warnings become Events.

    Example (a scripted fault, no GPU needed):

      gpufleet agent run --node-name gpu-1 --nvml fake:examples/faults/xid79.yaml
    """
    from prometheus_client import CollectorRegistry

    from gpufleet.agent.metrics import Metrics
    from gpufleet.agent.publish import NodePublisher
    from gpufleet.agent.runner import Agent
    from gpufleet.metrics_server import PortInUse, serve

    if not node_name:
        raise fail("--node-name is required (or set NODE_NAME, as the DaemonSet does)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    backend = _backend(nvml)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    publisher, thresholds = None, Thresholds()
    if not dry_run:
        api = _core(kubeconfig)
        thresholds = Thresholds.from_policy(_policy(api).health)
        publisher = NodePublisher(
            api.CoreV1Api(),
            node_name,
            heartbeat_s=heartbeat,
            on_error=lambda kind: metrics.agent_errors.labels(node_name, "publish", kind).inc(),
        )
    agent = Agent(
        node_name,
        backend,
        HealthMonitor(thresholds),
        publisher,
        metrics,
        poll_interval,
        dcgm_exporter,
    )
    if metrics_port:
        try:
            serve(metrics_port, "0.0.0.0", agent.health_problem, registry)
        except PortInUse as err:
            raise fail(f"{err}: stop it, or give this one another --metrics-port") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent.run(stop)


agent_app.command("standalone")(standalone)
ROOT = typer.Option(
    Path("/"), "--root", help="Write under this folder instead of / (an image being built)."
)


def _systemctl(*args: str) -> None:
    import shutil
    import subprocess

    if shutil.which("systemctl") is None:
        raise fail(f"no systemctl here: run `systemctl {' '.join(args)}` where systemd runs")
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise fail(f"systemctl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")


@agent_app.command("install")
def install(
    root: Path = ROOT,
    executable: str = typer.Option(
        "", "--exec", help="The gpufleet program the unit runs (default: this one)."
    ),
    start: bool = typer.Option(
        True, "--start/--no-start", help="Enable and start it now (with --root /)."
    ),
) -> None:
    """Install the standalone agent as a systemd service: the unit
    /etc/systemd/system/gpufleet-agent.service and its settings in /etc/gpufleet/agent.env
    (each documented; an existing one is kept), then enable and start it. To report to a
    gpufleet server, set GPUFLEET_SERVER in agent.env and put the host's token in
    /etc/gpufleet/token (an empty one is made).

    Example:

      sudo gpufleet agent install && sudo systemctl status gpufleet-agent

      gpufleet hosts token $(hostname) | sudo tee /etc/gpufleet/token >/dev/null
    """
    import shutil
    import sys

    from gpufleet.agent.systemd import (
        ENV_PATH,
        TOKEN_PATH,
        UNIT_NAME,
        UNIT_PATH,
        environment_file,
        unit,
    )

    program = executable or shutil.which("gpufleet") or f"{sys.prefix}/bin/gpufleet"
    if not Path(program).is_absolute() or not os.access(program, os.X_OK):
        raise fail(f"--exec {program}: not an executable file (give its absolute path)")
    unit_file, env_file = root / UNIT_PATH, root / ENV_PATH
    try:
        unit_file.parent.mkdir(parents=True, exist_ok=True)
        unit_file.write_text(unit(program))
        env_file.parent.mkdir(parents=True, exist_ok=True)
        kept = env_file.exists()
        if not kept:
            env_file.write_text(environment_file())
        token_file = root / TOKEN_PATH
        if not token_file.exists():  # systemd will not start a unit whose credential is absent
            token_file.touch(mode=0o600)
    except OSError as err:
        raise fail(f"cannot write {err.filename}: {err.strerror} (as root?)") from None
    console.print(f"wrote {unit_file}")
    console.print(f"{'kept' if kept else 'wrote'} {env_file}")
    if start and root == Path("/"):
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", UNIT_NAME)
        console.print(f"started {UNIT_NAME}: systemctl status gpufleet-agent")


@agent_app.command("status")
def status(
    metrics: str = typer.Option(
        "http://127.0.0.1:9402/metrics", "--metrics", help="The agent's /metrics."
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """What the running standalone agent says of itself: its GPUs, their health, the OTLP
    series it holds and what it took in or dropped (exits 1 when it does not answer).

    Example: gpufleet agent status
    """
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(metrics, timeout=5).text
    except httpx.HTTPError as err:
        raise fail(f"the agent does not answer at {metrics}: {err} (systemctl status "
                   "gpufleet-agent)") from None  # fmt: skip
    found: dict[str, Any] = {"gpus": 0, "unhealthyGPUs": 0, "otlpSeries": 0,
                             "otlpDataPoints": {}, "otlpDropped": {}}  # fmt: skip
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpufleet_gpu_healthy":
                found["gpus"] += 1
                found["unhealthyGPUs"] += sample.value == 0
            elif sample.name == "gpufleet_otlp_series":
                found["otlpSeries"] = int(sample.value)
            elif sample.name == "gpufleet_otlp_data_points_total":
                found["otlpDataPoints"][sample.labels["outcome"]] = int(sample.value)
            elif sample.name == "gpufleet_otlp_dropped_total":
                found["otlpDropped"][sample.labels["what"]] = int(sample.value)
            elif sample.name == "gpufleet_agent_reports_total":
                found.setdefault("reports", {})[sample.labels["outcome"]] = int(sample.value)
            elif sample.name == "gpufleet_agent_reports_buffered":
                found.setdefault("reports", {})["buffered"] = int(sample.value)
    if print_structured(found, output):
        return
    console.print(f"GPUs: {found['gpus']} ({found['unhealthyGPUs']} unhealthy)")
    console.print(f"OTLP series held: {found['otlpSeries']}")
    points = ", ".join(f"{k} {v}" for k, v in found["otlpDataPoints"].items()) or "none"
    console.print(f"OTLP data points: {points}")
    dropped = found["otlpDropped"]
    if any(dropped.values()):
        console.print(f"dropped by a full queue: {dropped}")
    reports = found.get("reports")
    if reports is None:
        console.print("reports: none (no --server)")
    else:
        console.print("reports to the server: " + ", ".join(f"{k} {v}" for k, v in reports.items()))


@agent_app.command("uninstall")
def uninstall(
    root: Path = ROOT,
    purge: bool = typer.Option(False, "--purge", help="Remove agent.env and the token too."),
) -> None:
    """Stop the standalone agent's service and remove its unit (and with --purge its
    settings and the host's token).

    Example: sudo gpufleet agent uninstall --purge
    """
    from gpufleet.agent.systemd import ENV_PATH, TOKEN_PATH, UNIT_NAME, UNIT_PATH

    unit_file = root / UNIT_PATH
    if root == Path("/") and unit_file.exists():
        _systemctl("disable", "--now", UNIT_NAME)
    for path in (unit_file, *([root / ENV_PATH, root / TOKEN_PATH] if purge else [])):
        if path.exists():
            path.unlink()
            console.print(f"removed {path}")
    if root == Path("/"):
        _systemctl("daemon-reload")


@agent_app.command("check")
def check(
    nvml: str = NVML,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Run every check once against NVML and print what it found (for a real GPU machine);
    exits 1 when a fatal finding exists.

    Example: gpufleet agent check -o json
    """
    from gpufleet.agent.backend import NVMLError
    from gpufleet.agent.runner import check_once

    try:
        readings, findings = check_once(_backend(nvml), HealthMonitor())
    except NVMLError as err:
        raise fail(str(err)) from None
    data = {
        "gpus": [
            {k: v for k, v in vars(r).items() if v is not None} for r in readings
        ],
        "findings": [
            {"gpu": f.gpu, "uuid": f.uuid, "severity": f.severity.value, "reason": f.reason,
             "message": f.message}
            for f in findings
        ],
    }  # fmt: skip
    fatal = any(f.severity == "fatal" for f in findings)
    if not print_structured(data, output):
        table = Table(box=box.SIMPLE)
        for column in ("GPU", "UUID", "TEMP °C", "POWER W", "UTIL %", "DBE", "REMAP"):
            table.add_column(column)
        for r in readings:
            table.add_row(
                str(r.index), r.uuid, _cell(r.temperature_c), _cell(r.power_w),
                _cell(r.utilization_pct), _cell(r.ecc_dbe_volatile),
                "failed" if r.remap_failure else "pending" if r.remap_pending else "ok",
            )  # fmt: skip
        console.print(table)
        for f in findings:
            console.print(f"{f.severity}: {f.reason}: {f.message}")
        console.print(f"{len(readings)} GPUs checked: {len(findings)} findings")
    if fatal:
        raise typer.Exit(1)


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@nodes_app.command("list")
def list_nodes(
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """GPU nodes with their GPUHealthy condition and quarantine state."""
    api = _core(kubeconfig)
    rows = []
    for node in api.CoreV1Api().list_node().items:
        labels = node.metadata.labels or {}
        if "gpufleet.io/pool" not in labels:
            continue
        cond = next(
            (c for c in node.status.conditions or [] if c.type == GPU_HEALTHY_CONDITION), None
        )
        notes = node.metadata.annotations or {}
        rows.append(
            {
                "node": node.metadata.name,
                "pool": labels["gpufleet.io/pool"],
                "gpuHealthy": cond.status if cond else "Unknown",
                "reason": cond.reason if cond else "",
                "quarantined": any(t.key == QUARANTINE_TAINT for t in node.spec.taints or []),
                "since": notes.get(QUARANTINED_AT_ANNOTATION, ""),
                "escalated": bool(notes.get(QUARANTINE_ESCALATED_ANNOTATION)),
                "why": notes.get(QUARANTINE_REASON_ANNOTATION, ""),
            }
        )
    if print_structured(rows, output):
        return
    table = Table(box=box.SIMPLE)
    for column in ("NODE", "POOL", "GPU HEALTHY", "REASON", "QUARANTINED", "SINCE"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["node"], r["pool"], r["gpuHealthy"], r["reason"],
                      "escalated" if r["escalated"] else "yes" if r["quarantined"] else "no",
                      r["since"])  # fmt: skip
    console.print(table)


@nodes_app.command("release")
def release(
    name: str = typer.Argument(..., help="The quarantined node."),
    by: str = typer.Option(os.environ.get("USER", "a person"), "--by", help="Who releases it."),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Take a node out of quarantine by hand (also an escalated one). The controller removes
    the taint and records who released it and when on the node (annotation
    gpufleet.io/released-manually) and in an Event."""
    api = _core(kubeconfig)
    stamp = f"{by} at {datetime.now(UTC).isoformat(timespec='seconds')}"
    core = api.CoreV1Api()
    try:
        node = core.read_node(name)
        if not any(t.key == QUARANTINE_TAINT for t in node.spec.taints or []):
            # a release request left on a healthy node would undo its next quarantine at once
            raise fail(
                f"node {name} is not quarantined (no {QUARANTINE_TAINT} taint): nothing to release"
            )
        core.patch_node(name, {"metadata": {"annotations": {RELEASE_ANNOTATION: stamp}}})
    except api.ApiException as err:
        raise fail(f"node {name}: {err.reason}") from None
    err_console.print(f"release of node {name} requested; the health controller applies it")


@nodes_app.command("reset-breaker")
def reset_breaker(
    namespace: str = typer.Option(
        os.environ.get("GPUFLEET_LEASE_NAMESPACE", "kube-system"), "--namespace", "-n"
    ),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Close the health circuit breaker (after the cause of the mass findings is understood):
    the controller quarantines again."""
    api = _core(kubeconfig)
    try:
        api.CoreV1Api().delete_namespaced_config_map(HEALTH_BREAKER, namespace)
    except api.ApiException as err:
        if err.status == 404:
            err_console.print("the breaker is not open")
            return
        raise fail(f"cannot reset the breaker: {err.reason}") from None
    err_console.print("health circuit breaker reset")

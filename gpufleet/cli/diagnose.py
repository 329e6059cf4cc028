"""`gpufleet workloads diagnose NAME`: why a workload failed, from the pattern bank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpufleet.cli.live import KUBECONFIG, ClusterReader, kube_client, workloads_app
from gpufleet.cli.output import OutputFormat, console, fail, print_structured


@workloads_app.command("diagnose")
def diagnose_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
    patterns: list[Path] = typer.Option(
        [], "--patterns", help="Folders of DiagnosisPattern files besides the bundled ones."
    ),
    fresh: bool = typer.Option(
        False, "--fresh", help="Collect the evidence again instead of showing the controller's."
    ),
    log_fixtures: Path | None = typer.Option(
        None, "--log-fixtures", help="Read logs from DIR/NAMESPACE/JOB.log (no kubelet logs)."
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Say why a workload failed: the pattern of policies/diagnosis/ its evidence matches
    (exit codes, reasons, Events, GPU health, log lines), who most likely has to act and what
    to do next. Shows the controller's diagnosis when it made one; --fresh collects again.

    Example: gpufleet workloads diagnose train -n nlp
    """
    reader = ClusterReader(kubeconfig)
    workload = reader.workload(namespace, name)
    status = workload.get("status") or {}
    state = status.get("state", "Pending")
    found: dict[str, Any] | None = None if fresh or patterns else status.get("diagnosis")
    if found is None:
        if state != "Failed":
            raise fail(f"{namespace}/{name} is {state}: only failed work is diagnosed")
        found = _diagnose_now(kubeconfig, reader, namespace, name, patterns, log_fixtures)
    data = {"workload": f"{namespace}/{name}", "state": state, **found}
    if print_structured(data, output):
        return
    owner = f" (likely owner: {found['owner']})" if found.get("owner") else ""
    console.print(
        f"{namespace}/{name}: [bold]{escape(found['pattern'])}[/bold]{owner}", markup=True
    )
    console.print(escape(found["summary"]), markup=True)
    if found.get("matched"):
        console.print("Matched: " + escape("; ".join(found["matched"])), markup=True)
    for action in found.get("actions") or []:
        console.print(f"  - {escape(action)}", markup=True)
    evidence = found.get("evidence") or {}
    if evidence:
        console.print("Evidence:")
        for key, value in evidence.items():
            if key == "lastLogLines":
                console.print("  last log lines:")
                for line in value:
                    console.print(f"    {escape(line)}", markup=True)
            else:
                console.print(f"  {key}: {escape(str(value))}", markup=True)


def _diagnose_now(
    kubeconfig: Path | None,
    reader: ClusterReader,
    namespace: str,
    name: str,
    patterns: list[Path],
    log_fixtures: Path | None,
) -> dict[str, Any]:
    from gpufleet.diagnose.collect import FixtureLogs, KubernetesLogs, LogReader, collect
    from gpufleet.diagnose.match import diagnose, load_patterns

    try:
        bank = load_patterns(patterns)
    except ValueError as err:
        raise fail(f"--patterns: {err}") from None
    client = kube_client(kubeconfig)
    core = client.CoreV1Api()
    try:
        read = reader.batch.read_namespaced_job(name, namespace)
    except reader.api_exception as err:
        raise fail(f"cannot read Job {namespace}/{name}: {err.reason}") from None
    job = client.ApiClient().sanitize_for_serialization(read)  # camelCase, as the API sends
    logs: LogReader = FixtureLogs(log_fixtures) if log_fixtures else KubernetesLogs(core)
    evidence = collect(core, namespace, job, logs)
    return diagnose(bank, evidence).status()

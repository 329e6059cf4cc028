"""`gpufleet controller run`: the operator, in the foreground."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpufleet.cli.output import fail
from gpufleet.metrics_server import PortInUse, check_free

controller_app = typer.Typer(help="The gpufleet controllers (kopf operator).", no_args_is_help=True)


@controller_app.command("run")
def run(
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="Cluster to manage; default $KUBECONFIG."
    ),
    webhook_host: str = typer.Option(
        "127.0.0.1", "--webhook-host", help="Address the API server reaches the webhooks at."
    ),
    webhook_port: int = typer.Option(9443, "--webhook-port"),
    interval: float = typer.Option(
        5.0,
        "--interval",
        help="Most seconds between workload-loop cycles: cycles run on watch events "
        "(Jobs, pods, nodes, GitOps objects) and timers (back-off ends); this is the resync.",
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help="Where the webhook's CA and certificate are written (a folder only you may read); "
        "default ~/.cache/gpufleet/controller-PORT, PORT the --webhook-port.",
    ),
    metrics_port: int = typer.Option(
        8080, "--metrics-port", help="Prometheus /metrics port (0 turns it off)."
    ),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host"),
    cluster_name: str = typer.Option(
        "gpufleet", "--cluster-name", help="Cluster name for rendered Karpenter objects."
    ),
    lease_namespace: str = typer.Option(
        "kube-system",
        "--lease-namespace",
        help="Namespace of the Lease that elects the one instance that decides.",
    ),
    scheduler_name: str = typer.Option(
        "",
        "--scheduler-name",
        help="Hand admitted pods to this scheduler (e.g. kai-scheduler, which also gets the "
        "team's queue label); default: kube-scheduler.",
    ),
    webhook_cert_dir: Path | None = typer.Option(
        None,
        "--webhook-cert-dir",
        help="Serve the webhooks with tls.crt/tls.key from this folder (a mounted Secret) "
        "instead of a generated certificate.",
    ),
    manage_webhooks: bool = typer.Option(
        True,
        "--manage-webhooks/--no-manage-webhooks",
        help="Register the webhook configurations with the API server (off when a Helm chart "
        "installs them).",
    ),
    install: bool = typer.Option(
        True,
        "--install/--no-install",
        help="Apply the CRDs and PriorityClasses at start (off when a Helm chart installs them).",
    ),
    ledger: str | None = typer.Option(
        None,
        "--ledger",
        envvar="GPUFLEET_LEDGER",
        help="Keep the usage ledger here: a SQLite file or a database URL "
        "(postgresql+psycopg://user:password@host/db); read it with gpufleet cost / usage. "
        "The database being down never stops scheduling: writes wait and are retried.",
    ),
    ledger_hosts_every: float = typer.Option(
        300.0,
        "--ledger-hosts-every",
        envvar="GPUFLEET_LEDGER_HOSTS_EVERY",
        min=1.0,
        help="Seconds between two records of the hosts' GPU-hours in the ledger (GPU hosts "
        "outside Kubernetes): a row per host and workload each time.",
    ),
    diagnosis_patterns: list[Path] = typer.Option(
        [],
        "--diagnosis-patterns",
        help="A folder of DiagnosisPattern files used besides the bundled ones "
        "(policies/diagnosis/); repeat for several.",
    ),
    log_fixtures: Path | None = typer.Option(
        None,
        "--log-fixtures",
        help="Read container logs for diagnosis from DIR/NAMESPACE/JOB.log instead of the API "
        "server (tests, and clusters whose kubelets serve no logs).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the controllers: install the CRDs and PriorityClasses, serve the admission webhooks
    for Jobs (registering them with the API server) and run the workload loop.

    Several instances may run: all serve webhooks; the holder of the Lease
    gpufleet-controller (in --lease-namespace) is the only one that decides.

    Example: gpufleet controller run --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig
    """
    # before kopf starts, whose failure to listen would be an internal error deep in its start
    # (the webhook's host is the name the API server calls, not an address to listen on)
    try:
        if metrics_port:
            check_free(metrics_host, metrics_port)
    except PortInUse as err:
        raise fail(f"{err}: stop it, or give this one another --metrics-port") from None
    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(kubeconfig)
    os.environ["GPUFLEET_WEBHOOK_HOST"] = webhook_host
    os.environ["GPUFLEET_WEBHOOK_PORT"] = str(webhook_port)
    os.environ["GPUFLEET_LOOP_INTERVAL"] = str(interval)
    os.environ["GPUFLEET_METRICS_PORT"] = str(metrics_port)
    os.environ["GPUFLEET_METRICS_HOST"] = metrics_host
    os.environ["GPUFLEET_CLUSTER_NAME"] = cluster_name
    os.environ["GPUFLEET_LEASE_NAMESPACE"] = lease_namespace
    os.environ["GPUFLEET_SCHEDULER_NAME"] = scheduler_name
    if state_dir is not None:
        os.environ["GPUFLEET_STATE_DIR"] = str(state_dir)
    os.environ["GPUFLEET_WEBHOOK_CERT_DIR"] = str(webhook_cert_dir or "")
    os.environ["GPUFLEET_MANAGE_WEBHOOKS"] = "true" if manage_webhooks else "false"
    os.environ["GPUFLEET_INSTALL"] = "true" if install else "false"
    os.environ["GPUFLEET_LEDGER"] = ledger or ""
    os.environ["GPUFLEET_LEDGER_HOSTS_EVERY"] = str(ledger_hosts_every)
    os.environ["GPUFLEET_DIAGNOSIS_PATTERNS"] = os.pathsep.join(map(str, diagnosis_patterns))
    os.environ["GPUFLEET_LOG_FIXTURES"] = str(log_fixtures or "")
    import kopf

    # importing the module registers its handlers with kopf (the one import of the controller
    # shell outside it: the import contract in pyproject.toml allows this one)
    import gpufleet.controllers.operator  # noqa: F401

    kopf.configure(verbose=verbose)
    kopf.run(standalone=True, clusterwide=True)

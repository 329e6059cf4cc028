"""`gpufleet notify test ROUTE`: send a test message over one notification route;
`gpufleet notify log`: what the routes delivered and what they gave up on."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.cost import _LEDGER, _OUTPUT, ReportFormat, _csv, _structured, read_ledger
from gpufleet.cli.output import console, err_console, fail
from gpufleet.cli.simulate import load_gitops
from gpufleet.ledger.reports import delivery_log
from gpufleet.model.api import SecretKeyRef
from gpufleet.notify.delivery import DeliveryError, SecretReader, send
from gpufleet.notify.messages import probe_notification

notify_app = typer.Typer(help="Notification routes (FleetPolicy spec.notifications).",
                         no_args_is_help=True)  # fmt: skip


@notify_app.command("test")
def test_command(
    route: str = typer.Argument(..., help="Name of the route in spec.notifications.routes."),
    gitops: list[Path] = typer.Option(
        ..., "--gitops", "-g", help="GitOps files or folders with the FleetPolicy."
    ),
    secret: list[str] = typer.Option(
        [],
        "--secret",
        help="A Secret key's value given here instead of read from the cluster: "
        "NAME/KEY=VALUE (repeat for each). Useful before the Secret exists.",
    ),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="Cluster to read the route's Secrets from; default $KUBECONFIG."
    ),
) -> None:
    """Send a test message over ROUTE as the controller would: the route as declared in git,
    its URL, signing key or password from its Kubernetes Secrets.

    Examples:

      gpufleet notify test nlp-slack --gitops gitops/

      gpufleet notify test ops-webhook --gitops gitops/ --secret ops-hook/url=https://...
    """
    fleet = load_gitops(gitops)
    routes = {r.name: r for r in fleet.policy.notifications.routes}
    if route not in routes:
        known = ", ".join(sorted(routes)) or "none are declared"
        raise fail(f"no notification route {route!r} in the FleetPolicies (routes: {known})")
    given: dict[tuple[str, str], str] = {}
    for item in secret:
        name_key, sep, value = item.partition("=")
        name, slash, key = name_key.partition("/")
        if not (sep and slash and name and key):
            raise fail(f"--secret {item!r}: write NAME/KEY=VALUE")
        given[(name, key)] = value
    reader = _reader(given, kubeconfig)
    try:
        send(routes[route], probe_notification(route, datetime.now(UTC)), reader)
    except DeliveryError as err:
        raise fail(f"route {route}: {err}") from err
    console.print(f"sent a test message over route {route} ({routes[route].type})")


def _reader(given: dict[tuple[str, str], str], kubeconfig: Path | None) -> SecretReader:
    cluster: SecretReader | None = None

    def read(ref: SecretKeyRef) -> str:
        nonlocal cluster
        if (ref.name, ref.key) in given:
            return given[(ref.name, ref.key)]
        if cluster is None:
            from kubernetes import client, config

            from gpufleet.kube.calls import KubernetesSecrets

            try:
                config.load_kube_config(str(kubeconfig) if kubeconfig else None)
            except Exception as err:  # no kubeconfig: say how to go on without one
                raise DeliveryError(
                    f"cannot read Secret {ref.namespace}/{ref.name} ({err}); give "
                    f"--secret {ref.name}/{ref.key}=VALUE or --kubeconfig"
                ) from err
            cluster = KubernetesSecrets(client.CoreV1Api())
        return cluster(ref)

    return read


@notify_app.command("log")
def log_command(
    ledger: str | None = _LEDGER,
    since: str | None = typer.Option(
        None, "--since", help="How far back (12h, 7d, 2026-12-01). Default: the last day."
    ),
    route: str | None = typer.Option(None, "--route", help="Only this route's."),
    kind: str | None = typer.Option(None, "--kind", help="Only this kind (preempted, ...)."),
    team: str | None = typer.Option(None, "--team", "-t", help="Only this team's."),
    outcome: str | None = typer.Option(None, "--outcome", help="sent or failed."),
    limit: int = typer.Option(500, "--limit", min=1, max=5000, help="At most this many rows."),
    output: ReportFormat = _OUTPUT,
) -> None:
    """The delivery log, newest first: each message a route delivered or gave up on (after
    its retries), when, how many tries and why it failed, from the ledger the controller
    writes (its --ledger). What a route delivered is not sent again after a restart within
    its dedupWindow.

    Examples:

      gpufleet notify log --ledger /var/lib/gpufleet/ledger.db --outcome failed

      gpufleet notify log --ledger postgresql+psycopg://gpufleet@db/ledger --since 7d -o csv
    """
    data = read_ledger(ledger, lambda store: delivery_log(
        store, since, limit=limit, route=route, kind=kind, team=team, outcome=outcome
    ))  # fmt: skip
    if output is ReportFormat.CSV:
        sys.stdout.write(_csv(data["items"], list(LOG_COLUMNS)))
        return
    if _structured(data, output):
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("AT", "ROUTE", "KIND", "TEAM", "OUTCOME", "TRIES", "TITLE / ERROR"):
        table.add_column(column, justify="right" if column == "TRIES" else "left")
    for row in data["items"]:
        table.add_row(
            row["at"][:19], row["route"], row["kind"], row["team"] or "-", row["outcome"],
            str(row["attempts"]), row["error"] or row["title"],
        )  # fmt: skip
    console.print(table)
    if not data["items"]:
        err_console.print(f"no delivery since {data['since'][:16]}")


LOG_COLUMNS = ("at", "happenedAt", "route", "kind", "team", "severity", "title", "outcome",
               "attempts", "error", "dedupKey", "cluster")  # fmt: skip

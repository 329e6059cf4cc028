"""`gpufleet notify test ROUTE`: send a test message over one notification route."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer

from gpufleet.cli.output import console, fail
from gpufleet.cli.simulate import load_gitops
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

"""The worker clusters of a fleet as the hub reaches them: the kubeconfig in each Cluster's
Secret (in the hub), and an API client of its own made from it, never the process's default
configuration. The hub, the hub's server and the CLI's --cluster reach workers this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client, config
from pydantic import ValidationError

from gpufleet.model.api import SecretKeyRef


class WorkerError(Exception):
    """A worker cannot be reached from the hub; the message says which and why."""


def kubeconfig_of(cluster: dict[str, Any], secrets: Callable[[SecretKeyRef], str]) -> str:
    """The kubeconfig of the Cluster object `cluster`, read through `secrets`."""
    name = cluster["metadata"]["name"]
    ref = (cluster.get("spec") or {}).get("kubeconfigSecretRef")
    try:
        secret = SecretKeyRef.model_validate(ref)
    except ValidationError:
        raise WorkerError(f"Cluster {name} names no valid spec.kubeconfigSecretRef") from None
    try:
        return secrets(secret)
    except Exception as err:  # not found, not readable: the reader's message says which
        raise WorkerError(f"Cluster {name}: its kubeconfig: {err}") from None


def worker_api(kubeconfig: str, connections: int = 8) -> client.ApiClient:
    """An API client of the cluster `kubeconfig` (its text) describes."""
    configuration = client.Configuration()
    try:
        config.load_kube_config_from_dict(
            yaml.safe_load(kubeconfig), client_configuration=configuration
        )
    except Exception as err:  # not YAML, no current context, no server: the client says which
        raise WorkerError(f"the kubeconfig cannot be used: {err}") from None
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)

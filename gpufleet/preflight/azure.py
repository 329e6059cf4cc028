"""Facts from Azure for the preflight, with azure-mgmt-compute and azure-mgmt-containerservice:
the region's VM sizes with their zones and restrictions, the vCPU quotas (usage), and the AKS
cluster's settings node auto-provisioning needs."""

from __future__ import annotations

from typing import Any

from gpufleet.model.fleet import Fleet
from gpufleet.preflight.checks import AzureFacts


def gather(
    fleet: Fleet,
    region: str,
    compute: Any,
    containers: Any = None,
    cluster: tuple[str, str] | None = None,
) -> AzureFacts:
    """`compute`: a ComputeManagementClient; `containers`: a ContainerServiceClient, read when
    `cluster` (resource group, name) is given."""
    wanted = {t.lower() for p in fleet.pools.values() if p.spec.provider == "azure"
              for t in p.spec.instance_types}  # fmt: skip
    facts = AzureFacts(region)
    for sku in compute.resource_skus.list(filter=f"location eq '{region}'"):
        key = (sku.name or "").lower()
        if sku.resource_type != "virtualMachines" or key not in wanted:
            continue
        zones = {z for info in sku.location_info or [] for z in info.zones or []}
        facts.offered[key] = zones
        for restriction in sku.restrictions or []:
            if restriction.type == "Location":
                facts.restricted[key] = _text(restriction.reason_code) or "restricted"
            elif restriction.type == "Zone" and restriction.restriction_info is not None:
                refused = set(restriction.restriction_info.zones or [])
                facts.zone_restricted.setdefault(key, set()).update(refused)
    for usage in compute.usage.list(region):
        facts.usage[usage.name.value.lower()] = (float(usage.current_value), float(usage.limit))
    if cluster is not None and containers is not None:
        found = containers.managed_clusters.get(*cluster)
        network = found.network_profile
        security = found.security_profile
        identity = security.workload_identity if security is not None else None
        facts.cluster = {
            "name": found.name,
            "nodeProvisioningMode": _text(getattr(found.node_provisioning_profile, "mode", None)),
            "networkPlugin": _text(getattr(network, "network_plugin", None)),
            "networkPluginMode": _text(getattr(network, "network_plugin_mode", None)),
            "networkDataplane": _text(getattr(network, "network_dataplane", None)),
            "oidcIssuer": bool(found.oidc_issuer_profile and found.oidc_issuer_profile.enabled),
            "workloadIdentity": bool(identity and identity.enabled),
        }
    return facts


def _text(value: Any) -> str | None:
    """An SDK enum's value (NetworkDataplane.CILIUM -> "cilium"), or the string it is."""
    if value is None:
        return None
    return str(getattr(value, "value", value))

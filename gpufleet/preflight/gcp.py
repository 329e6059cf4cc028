"""Facts from GCP for the preflight, with google-cloud-compute: accelerator and machine types
offered in each zone of the region, and the region's GPU quotas (limit minus usage)."""

from __future__ import annotations

from typing import Any

from gpufleet.preflight.checks import GcpFacts


def gather(project: str, region: str, regions: Any, accelerators: Any, machines: Any) -> GcpFacts:
    """`regions`, `accelerators`, `machines`: compute_v1 RegionsClient, AcceleratorTypesClient,
    MachineTypesClient (or objects answering the same calls)."""
    described = regions.get(project=project, region=region)
    zones = sorted(z.rsplit("/", 1)[-1] for z in described.zones)
    facts = GcpFacts(project, region, zones)
    for quota in described.quotas:
        facts.quotas[quota.metric] = float(quota.limit) - float(quota.usage)
    for zone in zones:
        for accelerator in accelerators.list(project=project, zone=zone):
            facts.accelerators.setdefault(accelerator.name, set()).add(zone)
        for machine in machines.list(project=project, zone=zone):
            facts.machine_types.setdefault(machine.name, set()).add(zone)
    return facts

"""Azure's GPU VM sizes: what each holds (GPU type and count, vCPUs, memory), the quota family
its cores count against, and an approximate pay-as-you-go price. Pure data and look-ups: the
validator refuses sizes it does not know (with the nearest name), the renderer's kwok shapes
and the preflight's quota check read it.

Sizes and their GPUs, vCPUs, memory and quota families are those of Microsoft's size pages
(ND H100 v5, ND H200 v5, ND A100 v4 and NDm A100 v4, NC A100 v4, NC H100 v5, NCads H100 v5,
NCas T4 v3, NVadsA10 v5). Prices are approximate East US Linux pay-as-you-go list prices per
VM-hour as published in 2025; spot prices move by the hour and are not kept here: read both
from Azure's Retail Prices API with `gpufleet prices azure --region R`. A pool's own
`pricePerGPUHour` always wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class AzureSize:
    gpu_type: str
    gpus: int
    vcpus: int
    memory_gib: int
    family: str  # the quota family its vCPUs count against (Usage name.value)
    price_per_hour: float | None  # USD, East US pay-as-you-go, approximate; None: not known


# whole-GPU sizes only: the NVadsA10 v5 sizes below NV36 hold a slice of one GPU
AZURE_GPU_SIZES: dict[str, AzureSize] = {
    "Standard_ND96isr_H100_v5": AzureSize("H100", 8, 96, 1900, "standardNDSH100v5Family", 98.32),
    "Standard_ND96isr_H200_v5": AzureSize("H200", 8, 96, 1850, "standardNDSH200v5Family", None),
    "Standard_ND96asr_v4": AzureSize("A100", 8, 96, 900, "standardNDASv4_A100Family", 27.20),
    "Standard_ND96amsr_A100_v4": AzureSize(
        "A100", 8, 96, 1900, "standardNDAMSv4_A100Family", 32.77
    ),
    "Standard_NC24ads_A100_v4": AzureSize("A100", 1, 24, 220, "StandardNCADSA100v4Family", 3.67),
    "Standard_NC48ads_A100_v4": AzureSize("A100", 2, 48, 440, "StandardNCADSA100v4Family", 7.35),
    "Standard_NC96ads_A100_v4": AzureSize("A100", 4, 96, 880, "StandardNCADSA100v4Family", 14.69),
    "Standard_NC40ads_H100_v5": AzureSize("H100", 1, 40, 320, "standardNCadsH100v5Family", 6.98),
    "Standard_NC80adis_H100_v5": AzureSize("H100", 2, 80, 640, "standardNCadsH100v5Family", 13.96),
    "Standard_NC4as_T4_v3": AzureSize("T4", 1, 4, 28, "standardNCASv3_T4Family", 0.53),
    "Standard_NC8as_T4_v3": AzureSize("T4", 1, 8, 56, "standardNCASv3_T4Family", 0.75),
    "Standard_NC16as_T4_v3": AzureSize("T4", 1, 16, 110, "standardNCASv3_T4Family", 1.20),
    "Standard_NC64as_T4_v3": AzureSize("T4", 4, 64, 440, "standardNCASv3_T4Family", 4.35),
    "Standard_NV36ads_A10_v5": AzureSize("A10", 1, 36, 440, "StandardNVADSA10v5Family", 3.20),
    "Standard_NV72ads_A10_v5": AzureSize("A10", 2, 72, 880, "StandardNVADSA10v5Family", 6.52),
}
# AKS labels a node's zone "<region>-<number>"
AZURE_ZONE = re.compile(r"^[a-z][a-z0-9]+-[1-9]$")
# the resource ID of a subnet (a pool's or a cluster's nodes)
AZURE_SUBNET_ID = (
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
    r"virtualNetworks/[^/]+/subnets/[^/]+$"
)
_BY_LOWER = {name.lower(): name for name in AZURE_GPU_SIZES}


def azure_size(name: str) -> AzureSize | None:
    """The size of that name (Azure's names are case-insensitive), else None."""
    found = _BY_LOWER.get(name.lower())
    return AZURE_GPU_SIZES[found] if found else None


def canonical_size(name: str) -> str:
    """The size's name as Azure spells it (its nodes' instance-type label), where known."""
    return _BY_LOWER.get(name.lower(), name)


def per_gpu_hour(name: str) -> float | None:
    """The size's approximate on-demand price per GPU-hour, where known."""
    size = azure_size(name)
    if size is None or size.price_per_hour is None:
        return None
    return round(size.price_per_hour / size.gpus, 4)


RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"  # public: no credentials


def retail_filter(region: str, sizes: list[str]) -> str:
    """The Retail Prices API's $filter for the Linux VM prices of `sizes` in `region`."""
    names = " or ".join(f"armSkuName eq '{canonical_size(s)}'" for s in sizes)
    return (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and "
        f"priceType eq 'Consumption' and ({names})"
    )


def retail_prices(items: list[dict[str, object]]) -> dict[str, dict[str, float]]:
    """Per VM size, its on-demand and spot price per VM-hour (USD) from the Retail Prices API's
    items: Linux pay-as-you-go only (no Windows, no Low Priority, no reservations)."""
    out: dict[str, dict[str, float]] = {}
    for item in items:
        product, sku = str(item.get("productName", "")), str(item.get("skuName", ""))
        if item.get("type") != "Consumption" or "Windows" in product or "Low Priority" in sku:
            continue
        if item.get("unitOfMeasure") != "1 Hour":
            continue
        kind = "spot" if sku.endswith(" Spot") else "on-demand"
        size = canonical_size(str(item.get("armSkuName", "")))
        price = float(str(item.get("retailPrice", 0)))
        # one price per size and kind; where Azure lists two (a meter's tiers), the lower
        out.setdefault(size, {})
        out[size][kind] = min(out[size].get(kind, price), price)
    return out

"""Public list prices per GPU-hour, for the idle cost of GPUs whose pool declares no price
(observe mode, before any GPUPool exists). Approximate AWS us-east-1 on-demand prices of the
8-GPU (or 1-GPU) instance divided by its GPUs, as published in 2025; a pool's own
`pricePerGPUHour` always wins."""

from __future__ import annotations

# canonical GPU type -> USD per GPU-hour
LIST_PRICES: dict[str, float] = {
    "H100": 6.88,  # p5.48xlarge, 8 x H100, $55.04/h after the June 2025 reduction
    "A100": 2.75,  # p4d.24xlarge, 8 x A100 40 GB, $21.96/h after the June 2025 reduction
    "A10G": 1.01,  # g5.xlarge, 1 x A10G
    "L4": 0.80,  # g6.xlarge, 1 x L4
    "L40S": 1.86,  # g6e.xlarge, 1 x L40S
}


def canonical_type(product: str) -> str | None:
    """The canonical type in a GPU product name such as `NVIDIA-H100-80GB-HBM3`, else None."""
    words = product.upper().replace("_", "-").replace(" ", "-").split("-")
    for gpu_type in sorted(LIST_PRICES, key=len, reverse=True):
        if gpu_type in words:
            return gpu_type
    return None


def list_price(gpu_type: str) -> float | None:
    found = canonical_type(gpu_type)
    return LIST_PRICES.get(found) if found else None

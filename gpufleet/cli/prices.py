"""`gpufleet prices azure`: the on-demand and spot prices of Azure's GPU VM sizes in a region,
per VM-hour and per GPU-hour, from Azure's public Retail Prices API; with --gitops, each azure
pool's `pricePerGPUHour` as those prices make it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import typer
from rich import box
from rich.table import Table

from gpufleet.cli.output import OutputFormat, console, err_console, fail, print_structured
from gpufleet.cli.simulate import load_gitops
from gpufleet.model import azure

prices_app = typer.Typer(help="Cloud list prices of GPU capacity.", no_args_is_help=True)


@prices_app.command("azure")
def azure_command(
    region: str = typer.Option(..., "--region", help="The Azure region (eastus, westeurope)."),
    gitops: list[Path] | None = typer.Option(
        None,
        "--gitops",
        "-g",
        help="Price these azure pools' VM sizes (default: every size gpufleet knows).",
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Azure's current Linux pay-as-you-go and Spot prices of the GPU VM sizes in REGION, per
    VM-hour and per GPU-hour, read from the Retail Prices API (public; no credentials). With
    --gitops, the pricePerGPUHour each azure pool would declare: the mean over its sizes. Spot
    prices move; read them again before you rely on them.

    Examples:

      gpufleet prices azure --region eastus

      gpufleet prices azure --region westeurope --gitops fleet/ -o yaml
    """
    fleet = load_gitops(gitops) if gitops else None
    pools = (
        {n: p.spec for n, p in fleet.pools.items() if p.spec.provider == "azure"} if fleet else {}
    )
    if fleet is not None and not pools:
        raise fail("the GitOps input has no azure pool (spec.provider: azure)")
    sizes = sorted(
        {azure.canonical_size(t) for spec in pools.values() for t in spec.instance_types}
        if pools
        else set(azure.AZURE_GPU_SIZES)
    )
    items = _read(region, sizes)
    found = azure.retail_prices(items)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        known = azure.azure_size(size)
        price = found.get(size, {})
        gpus = known.gpus if known else None
        rows.append(
            {
                "size": size,
                "gpuType": known.gpu_type if known else None,
                "gpus": gpus,
                "onDemandPerHour": price.get("on-demand"),
                "spotPerHour": price.get("spot"),
                "onDemandPerGPUHour": _per_gpu(price.get("on-demand"), gpus),
                "spotPerGPUHour": _per_gpu(price.get("spot"), gpus),
            }
        )
    data: dict[str, Any] = {"region": region, "sizes": rows}
    if pools:
        by_size = {r["size"]: r for r in rows}
        data["pools"] = {
            name: _pool_price([by_size[azure.canonical_size(t)] for t in spec.instance_types])
            for name, spec in sorted(pools.items())
        }
    if print_structured(data, output):
        return
    table = Table(box=box.SIMPLE_HEAD, title=f"Azure GPU VM prices, {region} (USD)")
    for column in ("SIZE", "GPU", "GPUS", "ON-DEMAND/H", "SPOT/H", "ON-DEMAND/GPU-H", "SPOT/GPU-H"):
        table.add_column(column, justify="left" if column in ("SIZE", "GPU") else "right")
    for row in rows:
        table.add_row(
            row["size"], row["gpuType"] or "-", str(row["gpus"] or "-"),
            *(_money(row[k]) for k in ("onDemandPerHour", "spotPerHour", "onDemandPerGPUHour",
                                        "spotPerGPUHour")),
        )  # fmt: skip
    console.print(table)
    for name, price in (data.get("pools") or {}).items():
        console.print(f"{name}: pricePerGPUHour: {price}")
    missing = [r["size"] for r in rows if r["onDemandPerHour"] is None]
    if missing:
        err_console.print(f"note: no price in {region} for {', '.join(missing)} (not offered?)")


def _read(region: str, sizes: list[str]) -> list[dict[str, Any]]:
    """Every page of the Retail Prices API's answer."""
    url: str | None = azure.RETAIL_PRICES_URL
    params: dict[str, str] | None = {"$filter": azure.retail_filter(region, sizes)}
    items: list[dict[str, Any]] = []
    try:
        with httpx.Client(timeout=30.0) as client:
            while url:
                answer = client.get(url, params=params)
                answer.raise_for_status()
                page = answer.json()
                items += page.get("Items") or []
                url, params = page.get("NextPageLink"), None  # the link carries the filter
    except (httpx.HTTPError, ValueError) as err:
        raise fail(
            f"cannot read Azure's Retail Prices API ({azure.RETAIL_PRICES_URL}): {err}"
        ) from None
    return items


def _per_gpu(price: float | None, gpus: int | None) -> float | None:
    return round(price / gpus, 4) if price is not None and gpus else None


def _pool_price(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for kind, key in (("onDemand", "onDemandPerGPUHour"), ("spot", "spotPerGPUHour")):
        values = [r[key] for r in rows if r[key] is not None]
        if values:
            out[kind] = round(sum(values) / len(values), 4)
    return out


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4g}" if value < 10 else f"${value:,.2f}"

"""What the Pulumi stacks (infra/aws, infra/gcp) share, kept free of cloud SDKs: configuration
errors that name the key, the GitOps fleet the GPU pools come from, and the GPU Operator values
that switch on the DCGM profiling fields GPU Usage needs (DESIGN §6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufleet.model import load_fleet
from gpufleet.model.fleet import Fleet

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "gpufleet"
DCGM_METRICS = """\
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_POWER_MGMT_LIMIT, gauge, Power management limit (in W).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_PROF_SM_ACTIVE, gauge, Ratio of cycles an SM has at least 1 warp assigned.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE, gauge, Ratio of cycles the device memory interface is active.
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
"""

# GCE accelerator names of the canonical GPU types (GPUPool.spec.gpuType)
GCE_ACCELERATORS = {
    "H100": "nvidia-h100-80gb",
    "A100": "nvidia-tesla-a100",
    "L4": "nvidia-l4",
    "T4": "nvidia-tesla-t4",
}

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A stack configuration value is missing or wrong; the message names the key."""


def parse_config(model: type[M], values: dict[str, Any], namespace: str = "gpufleet") -> M:
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise ConfigError(
            "; ".join(
                f"{namespace}:{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                for e in err.errors()
            )
        ) from None


def config_values(model: type[BaseModel], get: Any, fixed: dict[str, Any]) -> dict[str, Any]:
    """The model's keys read with `get(key)` (pulumi.Config.get); JSON lists are decoded."""
    values = {k: v for k, v in fixed.items() if v is not None}
    for field in model.model_fields.values():
        key = field.alias
        if key is None or key in values:
            continue
        raw = get(key)
        if raw is not None:
            values[key] = json.loads(raw) if raw.startswith("[") else raw
    return values


def fleet_from(path: Path) -> Fleet:
    loaded = load_fleet([path])
    errors = [p for p in loaded.problems if p.severity == "error"]
    if errors:
        first = errors[0]
        raise ConfigError(
            f"gpufleet:gitopsPath: {path} has {len(errors)} error(s), e.g. {first.file}:"
            f"{first.line}: {first.message}; run `gpufleet validate {path}`"
        )
    return loaded.fleet


def gpu_operator_values(driver: bool) -> dict[str, Any]:
    return {
        "driver": {"enabled": driver},
        "dcgmExporter": {
            "enabled": True,
            "config": {"name": "gpufleet-dcgm-metrics", "create": True, "data": DCGM_METRICS},
            "serviceMonitor": {"enabled": True},
        },
    }

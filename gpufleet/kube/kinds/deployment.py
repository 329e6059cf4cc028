"""apps/v1 Deployment, for inference: its `replicas` pods are one gang, held by gpufleet's
scheduling gate until admitted (see gated.py)."""

from __future__ import annotations

from .base import Obj, PodSet
from .gated import GatedKind


class Deployment(GatedKind):
    kind = "Deployment"
    api_version = "apps/v1"
    plural = "deployments"
    prefix = "deployment"

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        spec = obj.get("spec") or {}
        replicas = spec.get("replicas")
        return [
            PodSet("pods", 1 if replicas is None else int(replicas), spec.get("template") or {})
        ]

    def template_paths(self, obj: Obj) -> list[tuple[str, ...]]:
        return [("template",)]

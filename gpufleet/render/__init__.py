"""Renderers: gpufleet objects -> the Kubernetes objects of Karpenter, KAI and the scheduler.

Pure functions of a `Fleet`; the same renderers feed the CLI, the controllers and the IaC.
"""

from __future__ import annotations

from enum import StrEnum

from gpufleet.model.fleet import Fleet
from gpufleet.render.common import Manifest, file_name, to_yaml
from gpufleet.render.kai import render_kai_queues
from gpufleet.render.karpenter import (
    ClusterSettings,
    render_karpenter_aws,
    render_karpenter_azure,
    render_karpenter_gcp,
    render_karpenter_kwok,
)
from gpufleet.render.priorityclasses import render_priority_classes


class Target(StrEnum):
    KARPENTER_AWS = "karpenter-aws"
    KARPENTER_GCP = "karpenter-gcp"
    KARPENTER_AZURE = "karpenter-azure"
    KARPENTER_KWOK = "karpenter-kwok"  # the local dev cluster's simulated nodes
    KAI = "kai"
    PRIORITY_CLASSES = "priorityclasses"
    ALL = "all"  # what a cloud cluster gets: every target but karpenter-kwok


def render(fleet: Fleet, target: Target, cluster: ClusterSettings | None = None) -> list[Manifest]:
    """The objects of one target, in a stable order."""
    cluster = cluster or ClusterSettings()
    if target is Target.ALL:
        return [
            obj
            for part in (
                Target.PRIORITY_CLASSES,
                Target.KARPENTER_AWS,
                Target.KARPENTER_GCP,
                Target.KARPENTER_AZURE,
                Target.KAI,
            )
            for obj in render(fleet, part, cluster)
        ]
    if target is Target.KARPENTER_AWS:
        return render_karpenter_aws(fleet, cluster)
    if target is Target.KARPENTER_GCP:
        return render_karpenter_gcp(fleet)
    if target is Target.KARPENTER_AZURE:
        return render_karpenter_azure(fleet)
    if target is Target.KARPENTER_KWOK:
        return render_karpenter_kwok(fleet)
    if target is Target.KAI:
        return render_kai_queues(fleet)
    return render_priority_classes()


__all__ = ["ClusterSettings", "Manifest", "Target", "file_name", "render", "to_yaml"]

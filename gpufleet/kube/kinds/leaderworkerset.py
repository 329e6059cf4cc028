"""LeaderWorkerSet (sigs.k8s.io/lws), for multi-node inference: `replicas` groups of `size`
pods (a leader and size-1 workers); all of them one gang, held by gpufleet's scheduling gate
until admitted (see gated.py)."""

from __future__ import annotations

from .base import Obj, PodSet
from .gated import GatedKind


class LeaderWorkerSet(GatedKind):
    kind = "LeaderWorkerSet"
    api_version = "leaderworkerset.x-k8s.io/v1"
    plural = "leaderworkersets"
    prefix = "lws"

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        spec = obj.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = spec.get("leaderWorkerTemplate") or {}
        size = int(template.get("size", 1))
        worker = template.get("workerTemplate") or {}
        leader = template.get("leaderTemplate") or worker  # without one, leaders are workers
        return [PodSet("leader", replicas, leader), PodSet("worker", replicas * (size - 1), worker)]

    def template_paths(self, obj: Obj) -> list[tuple[str, ...]]:
        template = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
        # a leader template is written only where the LeaderWorkerSet has one of its own
        leader = "leaderTemplate" if "leaderTemplate" in template else "workerTemplate"
        return [("leaderWorkerTemplate", leader), ("leaderWorkerTemplate", "workerTemplate")]

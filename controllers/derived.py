"""The objects gpufleet derives from the fleet (PriorityClasses; Karpenter NodePools and
NodeClasses and KAI Queues where their CRDs are installed; the params of the tenancy admission
policy): rendered, applied server-side, and pruned when no longer rendered. Objects without
gpufleet's managed-by label are never touched."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from gpufleet.kube.calls import API_TIMEOUT_S
from gpufleet.kube.policies import tenancy_params
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import MANAGED_BY, MANAGED_BY_LABEL
from gpufleet.render import ClusterSettings, Manifest, Target, render

log = logging.getLogger("gpufleet.derived")
FIELD_MANAGER = "gpufleet-controller"
KWOK_CRD = "kwoknodeclasses.karpenter.kwok.sh"
# (apiVersion, kind, CRD that must be installed first; None: built in)
DERIVED = (
    ("scheduling.k8s.io/v1", "PriorityClass", None),
    ("karpenter.sh/v1", "NodePool", "nodepools.karpenter.sh"),
    ("karpenter.k8s.aws/v1", "EC2NodeClass", "ec2nodeclasses.karpenter.k8s.aws"),
    ("karpenter.k8s.gcp/v1alpha1", "GCENodeClass", "gcenodeclasses.karpenter.k8s.gcp"),
    ("karpenter.azure.com/v1beta1", "AKSNodeClass", "aksnodeclasses.karpenter.azure.com"),
    ("karpenter.kwok.sh/v1alpha1", "KWOKNodeClass", KWOK_CRD),
    ("scheduling.run.ai/v2", "Queue", "queues.scheduling.run.ai"),
)
SYNC_EVERY_S = 10.0  # how often the derived objects are checked (a CRD may appear any time)


def render_for_cluster(fleet: Fleet, cluster: ClusterSettings, kwok: bool) -> list[Manifest]:
    """What the cluster gets: the cloud's objects, or where Karpenter's kwok provider is
    installed (`gpufleet dev cluster up --autoscale`) every pool's NodePool with a KWOKNodeClass
    instead of its cloud's NodeClass."""
    if not kwok:
        return render(fleet, Target.ALL, cluster)
    parts = (Target.PRIORITY_CLASSES, Target.KARPENTER_KWOK, Target.KAI)
    return [obj for part in parts for obj in render(fleet, part, cluster)]


class DerivedSync:
    def __init__(self, api: client.ApiClient, cluster_name: str, namespace: str) -> None:
        self.dynamic = DynamicClient(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.cluster_name = cluster_name
        self.namespace = namespace  # the controller's: the tenancy params' ConfigMap is there
        # the user names the controller acts as (the tenancy policy lets them, and only them,
        # lift the gate and resume); set at startup
        self.controllers: tuple[str, ...] = ()
        self.scheduler = ""  # where admitted pods go ("": kube-scheduler); set at startup
        self.fingerprint = ""
        self.params_written: dict[str, Any] | None = None
        self.synced_at = 0.0

    def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply with our field manager: we own what we render, nothing else."""
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        self.dynamic.server_side_apply(
            resource,
            body=obj,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            _request_timeout=API_TIMEOUT_S,
        )

    def sync_if_due(self, fleet: Fleet) -> None:
        self.sync_params(fleet)
        if time.monotonic() - self.synced_at > SYNC_EVERY_S:
            self.sync(fleet)
            self.synced_at = time.monotonic()

    def sync(self, fleet: Fleet) -> None:
        """Apply what the fleet implies and delete what gpufleet rendered before but no longer
        does; nothing is written when neither the fleet nor the installed CRDs changed."""
        kinds = [k for k in DERIVED if k[2] is None or self.crd_installed(k[2])]
        objects = render_for_cluster(
            fleet,
            ClusterSettings(name=self.cluster_name),
            kwok=any(k[2] == KWOK_CRD for k in kinds),
        )
        served = {(k[0], k[1]) for k in kinds}
        wanted = [o for o in objects if (o["apiVersion"], o["kind"]) in served]
        fingerprint = json.dumps([sorted(served), wanted], sort_keys=True)
        if fingerprint == self.fingerprint:
            return
        for obj in wanted:
            self.apply(obj)
        for api_version, kind, _crd in kinds:
            resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
            names = {o["metadata"]["name"] for o in wanted if o["kind"] == kind}
            listed = resource.get(
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}", _request_timeout=API_TIMEOUT_S
            )
            for item in listed.items:
                if item.metadata.name not in names:
                    log.info("pruning %s %s, no longer rendered", kind, item.metadata.name)
                    resource.delete(name=item.metadata.name, _request_timeout=API_TIMEOUT_S)
        self.fingerprint = fingerprint

    def sync_params(self, fleet: Fleet) -> None:
        """Write the params of the tenancy and holding policies when the fleet changed them:
        each cycle, not every SYNC_EVERY_S, so that the API server follows a Team's namespaces
        closely (one ConfigMap, never pruned)."""
        params = tenancy_params(fleet, self.namespace, self.controllers, self.scheduler)
        if params != self.params_written:
            self.apply(params)
            self.params_written = params

    def crd_installed(self, name: str) -> bool:
        try:
            self.extensions.read_custom_resource_definition(name, _request_timeout=API_TIMEOUT_S)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

"""GPUs published for Dynamic Resource Allocation on the local control plane, the ground that
fractional GPUs will stand on (issue 51): kwok nodes' ResourceSlices as NVIDIA's DRA driver
publishes them, claims allocated by the real scheduler with no node plugin. Several pods that
share one claim share its GPU (the driver's time-slicing or MPS, from the claim's config); a
device is given to one claim at a time."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.testing.cluster import GPU_DRIVER, ControlPlane

SHARING = {
    "driver": GPU_DRIVER,
    "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing"},
    },
}


def _claim(name: str, namespace: str, index: int) -> dict[str, Any]:
    """A claim of the GPU with this index, shared by the pods that name it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": GPU_DRIVER,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f"device.attributes['{GPU_DRIVER}']"
                                        f".index == {index}"
                                    }
                                }
                            ],
                        },
                    }
                ],
                "config": [{"requests": ["gpu"], "opaque": SHARING}],
            }
        },
    }


def _pod(name: str, namespace: str, node: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "600s"},
        },
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "c",
                    "image": "example.com/c:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_pods_of_one_claim_share_its_gpu_and_a_device_serves_one_claim(
    cluster: ControlPlane, namespace: str
) -> None:
    (node,) = cluster.add_gpu_nodes(1, 8, "H100", prefix="dra")
    try:
        cluster.publish_gpu_devices([node])
        objects = [_claim("third", namespace, 3), _claim("also-third", namespace, 3)]
        objects += [_pod(f"quarter-{i}", namespace, node, "third") for i in range(4)]
        objects.append(_pod("other", namespace, node, "also-third"))
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(objects))

        def phase(pod: str) -> str:
            return str(cluster.get("pod", pod, "-n", namespace)["status"].get("phase"))

        cluster.wait_until(
            lambda: all(phase(f"quarter-{i}") == "Running" for i in range(4)), 60, "4 pods Running"
        )
        claim = cluster.get("resourceclaim", "third", "-n", namespace)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["device"], result["pool"]) == ("gpu-3", node)
        assert len(claim["status"]["reservedFor"]) == 4  # one GPU, four pods
        # the same device for another claim: not while the first holds it
        assert phase("other") == "Pending"
        assert not (
            cluster.get("resourceclaim", "also-third", "-n", namespace).get("status") or {}
        ).get("allocation")
        cluster.kubectl("delete", "pod", *(f"quarter-{i}" for i in range(4)), "-n", namespace)
        cluster.kubectl("delete", "resourceclaim", "third", "-n", namespace)
        cluster.wait_until(lambda: phase("other") == "Running", 60, "the other claim's pod Running")
    finally:  # no node of it left for the tests after it
        cluster.kubectl("delete", "resourceslice", f"{node}-{GPU_DRIVER}", "--wait=false")
        cluster.kubectl("delete", "node", node, "--wait=false")

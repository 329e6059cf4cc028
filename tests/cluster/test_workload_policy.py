"""Only the controller writes GPUWorkloads: the chart's policy
(`templates/workload-policy.yaml`) on the real API server refuses a tenant that RBAC lets
create one (a cancel deletes what it names, a bare pod is made again from it)."""

from __future__ import annotations

import json
import uuid

from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess
from .test_chart import CHART, helm


def test_a_tenant_cannot_write_a_gpu_workload_even_where_rbac_allows(
    cluster: ControlPlane, controller: ControllerProcess, namespace: str
) -> None:
    """A ServiceAccount whose Role lets it create GPUWorkloads is refused by the policy, an
    administrator is not (`controller`: it installs the CRDs)."""
    release = f"wp{uuid.uuid4().hex[:6]}"
    out = helm(
        "template", release, str(CHART), "-n", f"{release}-system",
        "--show-only", "templates/workload-policy.yaml",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cluster.kubectl("apply", "-f", "-", input=out.stdout)
    try:
        cluster.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
        cluster.kubectl(
            "create", "role", "gwl-writer", "-n", namespace,
            "--verb=create,update,patch,get", "--resource=gpuworkloads.gpufleet.io",
        )  # fmt: skip
        cluster.kubectl(
            "create", "rolebinding", "gwl-writer", "-n", namespace, "--role=gwl-writer",
            f"--serviceaccount={namespace}:tenant",
        )  # fmt: skip
        token = cluster.kubectl("create", "token", "tenant", "-n", namespace).stdout.strip()
        forged = {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "GPUWorkload",
            "metadata": {"name": "forged", "namespace": namespace},
            "spec": {"team": "any", "gpus": 1,
                     "workloadRef": {"apiVersion": "v1", "kind": "Pod", "name": "x"},
                     "podTemplate": {"spec": {"hostPID": True, "containers": []}}},
        }  # fmt: skip

        def create_as_tenant() -> str:
            made = cluster.kubectl_as(
                token, "create", "-f", "-", input=json.dumps(forged), check=False
            )
            return made.stderr if made.returncode != 0 else ""

        cluster.wait_until(
            lambda: "written by the gpufleet controller only" in create_as_tenant(),
            30,
            "the policy to refuse the tenant",
        )
        assert f"system:serviceaccount:{namespace}:tenant" in create_as_tenant()
        gone = cluster.kubectl("get", "gwl", "forged", "-n", namespace, check=False)
        assert gone.returncode != 0
        # a cluster administrator (system:masters) still may, as the controller itself
        assert cluster.kubectl("create", "-f", "-", input=json.dumps(forged)).returncode == 0
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input=out.stdout, check=False)

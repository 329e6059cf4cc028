"""The local control plane behaves like a real cluster for what gpufleet relies on."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml

from gpufleet.pki import issue_serving_cert
from gpufleet.testing.cluster import ControlPlane, free_port

REPO = Path(__file__).resolve().parents[2]


def gpu_job(name: str, gpus: int, suspend: bool = False, run_for: str = "1s") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpufleet.io/run-for": run_for}},
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def job_status(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = cluster.get("job", name, "-n", namespace)
    status: dict[str, Any] = job.get("status", {})
    return status


def pods(cluster: ControlPlane, namespace: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("pods", "-n", namespace, "-l", f"job-name={job}")[
        "items"
    ]
    return items


def test_gpu_job_runs_to_completion(
    cluster: ControlPlane, gpu_nodes: list[str], namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_job("eight", 8)))
    cluster.wait_until(
        lambda: job_status(cluster, namespace, "eight").get("succeeded") == 1,
        60,
        "job eight to succeed",
    )
    (pod,) = pods(cluster, namespace, "eight")
    assert pod["spec"]["nodeName"] in gpu_nodes
    assert pod["status"]["phase"] == "Succeeded"


def test_job_asking_more_gpus_than_a_node_has_is_unschedulable(
    cluster: ControlPlane, gpu_nodes: list[str], namespace: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_job("sixteen", 16))
    )

    def unschedulable() -> bool:
        found = pods(cluster, namespace, "sixteen")
        conditions = found[0].get("status", {}).get("conditions", []) if found else []
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
        )

    cluster.wait_until(unschedulable, 60, "the 16-GPU pod to be reported Unschedulable")
    (pod,) = pods(cluster, namespace, "sixteen")
    assert pod["status"]["phase"] == "Pending"
    assert "nvidia.com/gpu" in json.dumps(pod["status"]["conditions"])


def test_suspended_job_creates_no_pods_until_resumed(
    cluster: ControlPlane, gpu_nodes: list[str], namespace: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_job("held", 4, suspend=True))
    )
    cluster.wait_until(
        lambda: any(
            c["type"] == "Suspended" and c["status"] == "True"
            for c in job_status(cluster, namespace, "held").get("conditions", [])
        ),
        60,
        "the Job controller to mark the job Suspended",
    )
    assert pods(cluster, namespace, "held") == []
    cluster.kubectl(
        "patch",
        "job",
        "held",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )
    cluster.wait_until(
        lambda: job_status(cluster, namespace, "held").get("succeeded") == 1,
        60,
        "the resumed job to succeed",
    )


def test_third_party_crds_accept_rendered_objects(cluster: ControlPlane, shared_crds: Path) -> None:
    installed = cluster.install_crds([shared_crds, REPO / "charts" / "gpufleet" / "crds"])
    assert "nodepools.karpenter.sh" in installed
    assert "queues.scheduling.run.ai" in installed
    assert "gpupools.gpufleet.io" in installed
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "render",
            str(REPO / "examples" / "gitops"),
            "--target",
            "all",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    try:
        _check_rendered_and_own_objects(cluster, rendered)
    finally:
        # cluster-scoped objects outlive the test: leave nothing for the controller tests
        cluster.kubectl(
            "delete", "-f", "-", "--ignore-not-found", "--wait=false", input=rendered, check=False
        )
        cluster.kubectl(
            "delete",
            "-f",
            str(REPO / "examples" / "gitops"),
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )


def _check_rendered_and_own_objects(cluster: ControlPlane, rendered: str) -> None:
    result = cluster.apply(rendered, check=False)
    assert result.returncode == 0, result.stderr
    queues = cluster.get("queues.scheduling.run.ai")["items"]
    assert {q["metadata"]["name"] for q in queues} >= {"nlp", "vision", "research"}
    # our own CRDs accept the example organisation, defaults filled in by the API server
    result = cluster.kubectl(
        "apply", "--server-side", "-f", str(REPO / "examples" / "gitops"), check=False
    )
    assert result.returncode == 0, result.stderr
    pool = cluster.get("gpupool", "us-east-a100")
    assert pool["spec"]["consolidateAfter"] == "10m"
    # and a wrong field or value is rejected by the server
    broken = yaml.safe_load_all(rendered)
    nodepool = next(o for o in broken if o and o["kind"] == "NodePool")
    nodepool["metadata"]["name"] = "broken"
    nodepool["spec"]["disruption"]["consolidationPolicy"] = "Sometimes"
    result = cluster.apply([nodepool], check=False)
    assert result.returncode != 0
    assert "Sometimes" in result.stderr
    team = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Team",
        "metadata": {"name": "bad"},
        "spec": {"burstingPriority": 11, "colour": "red"},
    }
    result = cluster.apply([team], check=False)
    assert result.returncode != 0
    assert "colour" in result.stderr or "burstingPriority" in result.stderr


class _Recorder(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        _Recorder.calls.append(request)
        labels = request["object"]["metadata"].get("labels", {})
        allowed = labels.get("gpufleet-test") != "deny"
        response = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": request["uid"],
                "allowed": allowed,
                "status": {"message": "denied by the test webhook"},
            },
        }
        body = json.dumps(response).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    from gpufleet.pki import create_pki

    pki = create_pki(tmp_path / "pki")
    issue_serving_cert(
        pki.ca_cert, pki.ca_key, tmp_path / "hook.crt", tmp_path / "hook.key", ["127.0.0.1"]
    )
    port = free_port()
    server = HTTPServer(("127.0.0.1", port), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / "hook.crt"), str(tmp_path / "hook.key"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield port, pki.ca_cert.read_bytes()
    server.shutdown()


def test_api_server_calls_a_local_validating_webhook(
    cluster: ControlPlane, namespace: str, webhook_server: tuple[int, bytes]
) -> None:
    port, ca = webhook_server
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"test-{namespace}"},
        "webhooks": [
            {
                "name": "configmaps.test.gpufleet.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    cluster.apply([config])
    try:

        def create(name: str, label: str) -> subprocess.CompletedProcess[str]:
            cm = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {"gpufleet-test": label},
                },
            }
            return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(cm), check=False)

        # the configuration takes effect within a moment: retry the allowed create until then
        cluster.wait_until(
            lambda: (
                create(f"ok-{len(_Recorder.calls)}", "allow").returncode == 0
                and bool(_Recorder.calls)
            ),
            30,
            "the webhook to be called",
        )
        denied = create("no", "deny")
        assert denied.returncode != 0
        assert "denied by the test webhook" in denied.stderr
        assert any(c["object"]["metadata"]["name"] == "no" for c in _Recorder.calls)
    finally:
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", f"test-{namespace}", check=False
        )


def test_a_port_taken_before_its_component_binds_it_starts_again(
    cluster: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() finds a free port, but another process may take it before the component
    binds it (here: kube-scheduler's): the control plane starts again on new ports."""
    import socket

    from gpufleet.testing import cluster as harness

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = harness.free_port
    # etcd, etcd-peer, apiserver, controller-manager, then the scheduler's: the busy one
    picks = iter([real(), real(), real(), real(), busy])
    monkeypatch.setattr(harness, "free_port", lambda: next(picks, None) or real())
    plane = ControlPlane(tmp_path / "plane", cluster.bin_dir)
    try:
        plane.start()
        assert plane.ports["scheduler"] != busy
        assert plane.kubectl("get", "namespace", "default").returncode == 0
    finally:
        plane.stop()
        taken.close()


def test_etcd_takes_only_the_api_servers_certificate(cluster: ControlPlane) -> None:
    """etcd holds every Secret of the cluster: no plain HTTP, no client without a
    certificate, and none with the cluster CA's admin certificate (etcd has a CA of its own);
    the API server's own client certificate is the one that gets in."""
    pki = cluster.pki
    url = f"127.0.0.1:{cluster.ports['etcd']}"

    def health(**tls: Any) -> int | None:
        try:
            return httpx.get(f"https://{url}/health", timeout=10, **tls).status_code
        except httpx.HTTPError:
            return None  # the handshake refused

    trust_etcd = ssl.create_default_context(cafile=str(pki.etcd.ca_cert))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{url}/health", timeout=10)
    assert health(verify=trust_etcd) is None
    admin = ssl.create_default_context(cafile=str(pki.etcd.ca_cert))
    admin.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    assert health(verify=admin) is None
    apiserver = ssl.create_default_context(cafile=str(pki.etcd.ca_cert))
    apiserver.load_cert_chain(str(pki.etcd_client_cert), str(pki.etcd_client_key))
    assert health(verify=apiserver) == 200

"""The Helm chart: `helm lint` is clean, `helm template` renders what the design asks for, and
`helm install` into the real control plane is accepted (CRDs, RBAC, webhook configurations,
Deployment, DaemonSet), with least-privilege RBAC checked by the API server itself."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import skip_unless_ci

from gpufleet.kube.chart import (
    CONTROLLER_VERBS,
    SERVER_VERBS,
    admission_rules,
    check_rules,
    role_rules,
)
from gpufleet.render.priorityclasses import render_priority_classes
from gpufleet.testing.cluster import ControlPlane, default_bin_dir

from .conftest import job_manifest

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpufleet"
NAMESPACE = "gpufleet-system"


def helm_binary() -> Path:
    found = default_bin_dir() / "helm"
    if not os.access(found, os.X_OK):
        skip_unless_ci(f"helm not found at {found}: run hack/k8s/build.sh (it builds helm from Go)")
    return found


def helm(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/gpufleet-helm/cache",
           "HELM_CONFIG_HOME": "/tmp/gpufleet-helm/config",
           "HELM_DATA_HOME": "/tmp/gpufleet-helm/data"}  # fmt: skip
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=120
    )


def rendered(*sets: str) -> list[dict[str, Any]]:
    out = helm("template", "gpufleet", str(CHART), "-n", NAMESPACE, *sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_lint_is_clean() -> None:
    for sets in (
        [],
        ["--set", "webhook.certManager.enabled=true"],
        ["--set", "hub.enabled=true", "--set", "server.fleet=true"],  # a fleet's hub
    ):
        out = helm("lint", str(CHART), "--strict", *sets)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout
        assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_template_renders_the_design() -> None:
    objects = rendered()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in (
        ("Deployment", "gpufleet-controller"),
        ("DaemonSet", "gpufleet-agent"),
        ("Service", "gpufleet-webhook"),
        ("Secret", "gpufleet-webhook-cert"),
        ("MutatingWebhookConfiguration", "gpufleet-jobs"),
        ("ClusterRole", "gpufleet-controller"),
        ("ClusterRole", "gpufleet-agent"),
        ("ValidatingAdmissionPolicy", "gpufleet-tenancy.gpufleet.io"),
        ("ValidatingAdmissionPolicyBinding", "gpufleet-tenancy.gpufleet.io"),
        ("ValidatingAdmissionPolicy", "gpufleet-agent-node.gpufleet.io"),
        ("ValidatingAdmissionPolicy", "gpufleet-gpuworkloads.gpufleet.io"),
    ):
        assert expected in kinds
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    # one webhook for the workloads (it refuses and mutates), one for what the holding
    # policies could not vouch for and one for the pods of the gated kinds, reaching the
    # controller through the Service, with the generated CA (bare pods are held by the API
    # server's policy, as Jobs and Deployments are)
    assert "ValidatingWebhookConfiguration" not in {kind for kind, _name in kinds}
    webhook, check, pods = by[("MutatingWebhookConfiguration", "gpufleet-jobs")]["webhooks"]
    for hook in (webhook, check, pods):
        assert hook["clientConfig"]["service"]["path"] == "/admit-jobs"
        assert hook["clientConfig"]["caBundle"]
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert NAMESPACE in excluded and "kube-system" in excluded
    # every workload kind's creates but Jobs'; of the pods, only those a gated kind labelled
    assert webhook["rules"] == admission_rules()  # the registry's kinds, each one's creation
    assert webhook["failurePolicy"] == "Fail"
    # Jobs, Deployments and bare pods, only those the holding policy could not vouch for,
    # never blocking a create
    assert check["rules"] == check_rules() and check["failurePolicy"] == "Ignore"
    assert {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
            "operations": ["CREATE"], "scope": "Namespaced"} in check["rules"]  # fmt: skip
    for kind in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"):
        assert any(o["kind"] == kind for o in objects), kind
    params = by[("ConfigMap", "gpufleet-tenancy")]
    assert params["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    controller_role = by[("ClusterRole", "gpufleet-controller")]["rules"]
    assert all(rule in controller_role for rule in role_rules(CONTROLLER_VERBS))
    server_role = by[("ClusterRole", "gpufleet-server")]["rules"]
    assert all(rule in server_role for rule in role_rules(SERVER_VERBS))
    assert pods["rules"][0]["resources"] == ["pods"]
    assert pods["objectSelector"]["matchExpressions"] == [
        {"key": "gpufleet.io/workload", "operator": "Exists"}
    ]
    # as the dev controller's own configuration has them
    from gpufleet.controllers import webhooks

    dev_hooks = webhooks.configuration("localhost", 1, CHART / "Chart.yaml", [])["webhooks"]
    assert [h["name"] for h in dev_hooks] == [h["name"] for h in (webhook, check, pods)]
    dev_check, dev_pods = dev_hooks[1], dev_hooks[2]
    assert check["matchConditions"] == dev_check["matchConditions"]
    # pods already gated (a Deployment's, from its template) never reach it
    assert pods["matchConditions"] == dev_pods["matchConditions"]
    assert (
        pods["rules"] == dev_pods["rules"] and pods["objectSelector"] == dev_pods["objectSelector"]
    )
    # agent on GPU nodes only, tolerating the GPU and quarantine taints
    agent = by[("DaemonSet", "gpufleet-agent")]["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {t["key"] for t in agent["tolerations"]} >= {
        "nvidia.com/gpu",
        "gpufleet.io/gpu-unhealthy",
    }
    probe = agent["containers"][0]["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "metrics"}
    controller = by[("Deployment", "gpufleet-controller")]
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-manage-webhooks" in args and "--no-install" in args
    # the ledger: by default a SQLite file on a kept PersistentVolume, so one replica
    assert "--ledger=/var/lib/gpufleet/ledger.db" in args
    assert controller["spec"]["replicas"] == 1
    assert controller["spec"]["strategy"] == {"type": "Recreate"}
    claim = by[("PersistentVolumeClaim", "gpufleet-ledger")]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert ("PodDisruptionBudget", "gpufleet-controller") not in kinds  # it would block drains
    # PostgreSQL by URL from a Secret: the replicas as asked, no volume
    postgres = rendered("--set", "ledger.mode=url", "--set", "ledger.urlSecret.name=ledger-db")
    deployment = next(
        o for o in postgres if o["kind"] == "Deployment" and "controller" in o["metadata"]["name"]
    )
    assert deployment["spec"]["replicas"] == 2
    (env,) = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == {
        "name": "GPUFLEET_LEDGER",
        "valueFrom": {"secretKeyRef": {"name": "ledger-db", "key": "url"}},
    }
    assert not [o for o in postgres if o["kind"] == "PersistentVolumeClaim"]
    server_env = next(
        o for o in postgres if o["kind"] == "Deployment" and "server" in o["metadata"]["name"]
    )["spec"]["template"]["spec"]["containers"][0]["env"]
    assert server_env == [env]  # /api/v1/cost reads the same ledger
    assert ("PodDisruptionBudget", "gpufleet-controller") in {
        (o["kind"], o["metadata"]["name"]) for o in postgres
    }
    # the notification routes' Secrets, in the release namespace only
    role = by[("Role", "gpufleet-controller")]
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in role["rules"]
    assert controller["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    # least privilege: no wildcards anywhere
    for role in (o for o in objects if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role["metadata"]
    # with cert-manager: a Certificate and CA injection instead of a generated Secret
    managed = {(o["kind"], o["metadata"]["name"]): o for o in rendered(
        "--set", "webhook.certManager.enabled=true")}  # fmt: skip
    assert ("Certificate", "gpufleet-webhook") in managed
    assert ("Secret", "gpufleet-webhook-cert") not in managed
    hooks = managed[("MutatingWebhookConfiguration", "gpufleet-jobs")]
    assert hooks["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/gpufleet-webhook"
    )
    # gpufleet server: its own Deployment and Service; it reviews tokens and access
    server = by[("Deployment", "gpufleet-server")]["spec"]["template"]["spec"]
    assert server["containers"][0]["args"][:3] == ["server", "--host=0.0.0.0", "--port=8090"]
    assert server["serviceAccountName"] == "gpufleet-server"
    assert by[("Service", "gpufleet-server")]["spec"]["ports"][0]["port"] == 80
    server_rules = by[("ClusterRole", "gpufleet-server")]["rules"]
    for group, resource in (("authentication.k8s.io", "tokenreviews"),
                            ("authorization.k8s.io", "subjectaccessreviews")):  # fmt: skip
        assert {"apiGroups": [group], "resources": [resource], "verbs": ["create"]} in server_rules
    assert ("ClusterRole", "gpufleet-viewer") in kinds
    impersonates = {"apiGroups": [""], "resources": ["users", "groups", "serviceaccounts"],
                    "verbs": ["impersonate"]}  # fmt: skip
    assert impersonates in server_rules
    # the rate limits are the Service's: one replica takes them whole, three a third each
    assert {"--rate-limit=20", "--rate-burst=60"} <= set(server["containers"][0]["args"])
    three = {(o["kind"], o["metadata"]["name"]): o for o in rendered("--set", "server.replicas=3")}
    args = three[("Deployment", "gpufleet-server")]["spec"]["template"]["spec"]["containers"][0]
    rate = next(a for a in args["args"] if a.startswith("--rate-limit="))
    assert abs(float(rate.split("=")[1]) - 20 / 3) < 1e-6, rate
    assert "--rate-burst=20" in args["args"]
    no_submit = {
        (o["kind"], o["metadata"]["name"]): o for o in rendered("--set", "server.submit=false")
    }
    assert impersonates not in no_submit[("ClusterRole", "gpufleet-server")]["rules"]
    assert not [
        o for o in rendered("--set", "server.enabled=false") if "server" in o["metadata"]["name"]
    ]
    without_agent = rendered("--set", "agent.enabled=false")
    assert not [
        o for o in without_agent if o["kind"] == "DaemonSet" or "agent" in o["metadata"]["name"]
    ]


@pytest.fixture
def installed(cluster: ControlPlane) -> Iterator[ControlPlane]:
    out = helm(
        "install", "gpufleet", str(CHART), "-n", NAMESPACE, "--create-namespace",
        # no controller runs in this test: failing closed would block every Job of the session
        "--set", "webhook.failurePolicy=Ignore", "--wait=false",
        kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    try:
        yield cluster
    finally:
        helm("uninstall", "gpufleet", "-n", NAMESPACE, kubeconfig=cluster.kubeconfig)
        # the ledger's claim is kept by an uninstall (helm.sh/resource-policy: keep)
        cluster.kubectl("delete", "pvc", "gpufleet-ledger", "-n", NAMESPACE, check=False)


def test_install_into_the_control_plane(installed: ControlPlane) -> None:
    cluster = installed
    for kind, name in (
        ("customresourcedefinition", "gpupools.gpufleet.io"),
        ("customresourcedefinition", "gpuworkloads.gpufleet.io"),
        ("clusterrole", "gpufleet-controller"),
        ("clusterrolebinding", "gpufleet-agent"),
        ("mutatingwebhookconfiguration", "gpufleet-jobs"),
        ("validatingadmissionpolicy", "gpufleet-tenancy.gpufleet.io"),
        ("validatingadmissionpolicybinding", "gpufleet-tenancy.gpufleet.io"),
    ):
        assert cluster.kubectl("get", kind, name, check=False).returncode == 0, (kind, name)
    for kind, name in (("deployment", "gpufleet-controller"), ("daemonset", "gpufleet-agent"),
                       ("deployment", "gpufleet-server"), ("service", "gpufleet-server"),
                       ("secret", "gpufleet-webhook-cert"), ("role", "gpufleet-controller"),
                       ("persistentvolumeclaim", "gpufleet-ledger")):  # fmt: skip
        assert cluster.kubectl("get", kind, name, "-n", NAMESPACE, check=False).returncode == 0
    # the API server's own RBAC evaluation: what each service account may and may not do
    sa = f"system:serviceaccount:{NAMESPACE}"

    def can(who: str, *what: str) -> bool:
        out = cluster.kubectl("auth", "can-i", *what, f"--as={sa}:{who}", check=False)
        return out.stdout.strip() == "yes"

    assert can("gpufleet-controller", "patch", "nodes")
    assert can("gpufleet-controller", "patch", "jobs.batch", "-A")
    assert can("gpufleet-controller", "create", "leases.coordination.k8s.io", "-n", NAMESPACE)
    assert not can("gpufleet-controller", "create", "leases.coordination.k8s.io", "-n", "default")
    assert not can("gpufleet-controller", "create", "customresourcedefinitions")
    # pods: deleted to preempt a Deployment (whose ReplicaSet makes them again, held) or a bare
    # pod, which the controller makes again itself
    assert can("gpufleet-controller", "delete", "pods", "-A")
    assert can("gpufleet-controller", "create", "pods", "-A")
    assert can("gpufleet-controller", "delete", "gpuworkloads.gpufleet.io", "-A")
    assert not can("gpufleet-controller", "delete", "deployments.apps", "-A")
    assert not can("gpufleet-controller", "get", "secrets", "-A")
    assert can("gpufleet-controller", "get", "secrets", "-n", NAMESPACE)  # notification routes
    # the tenancy policy's params, applied server-side
    assert can("gpufleet-controller", "patch", "configmaps", "-n", NAMESPACE)
    assert not can("gpufleet-controller", "patch", "configmaps", "-n", "default")
    assert can("gpufleet-agent", "patch", "nodes", "--subresource=status")
    assert not can("gpufleet-agent", "patch", "nodes")
    assert not can("gpufleet-agent", "list", "pods", "-A")
    assert can("gpufleet-server", "create", "tokenreviews.authentication.k8s.io")
    assert can("gpufleet-server", "create", "subjectaccessreviews.authorization.k8s.io")
    assert can("gpufleet-server", "delete", "jobs.batch", "-A")
    assert can("gpufleet-server", "delete", "pods", "-A")  # cancelling a bare pod
    assert not can("gpufleet-server", "patch", "jobs.batch", "-A")
    assert not can("gpufleet-server", "get", "secrets", "-A")
    # submissions are made as their callers: it may act as them, not create Jobs as itself
    assert can("gpufleet-server", "impersonate", "users")
    assert can("gpufleet-server", "impersonate", "serviceaccounts", "-A")
    assert not can("gpufleet-server", "create", "jobs.batch", "-A")


def test_with_no_controller_answering_a_tenants_job_is_created_held(
    installed: ControlPlane,
) -> None:
    """The chart's controller never runs here (kwok has no kubelet): as when it is deleted or
    restarting. A tenant's GPU Job is still created, held by the API server itself. (A dev
    controller's webhooks, which would answer, are taken away meanwhile.)"""
    cluster = installed
    namespace = "tenant-chart"
    cluster.kubectl("create", "namespace", namespace, check=False)
    dev = cluster.kubectl(
        "get", "mutatingwebhookconfiguration", "gpufleet.io", "-o", "json", check=False
    )
    if dev.returncode == 0:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "gpufleet.io")
    try:
        body = job_manifest("held", namespace, {"gpufleet.io/team": "nlp"}, 1, 2, "60s")
        # on no node: a Job made before the policy holds it takes no GPU the next tests need
        body["spec"]["template"]["spec"]["nodeSelector"] = {"gpufleet.io/pool": "no-such-pool"}

        # the API server takes a moment to pick a new policy up: a Job created before that is
        # not held, and is made again (every create must succeed meanwhile)
        def created_held() -> bool:
            created = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)
            assert created.returncode == 0, created.stderr
            held = cluster.get("job", "held", "-n", namespace)["spec"]["template"]["spec"]
            if held.get("schedulingGates"):
                return True
            cluster.kubectl("delete", "job", "held", "-n", namespace, "--wait")
            return False

        cluster.wait_until(created_held, 30, "a Job held by the chart's policy")
        job = cluster.get("job", "held", "-n", namespace)
        annotations = job["metadata"]["annotations"]
        # the shipped params know no team yet: held, and marked for the webhook to check
        assert annotations["gpufleet.io/managed"] == "true"
        assert annotations["gpufleet.io/check"] == "true"
        template = job["spec"]["template"]["spec"]
        assert template["priorityClassName"] == "gpufleet-elastic-normal"
        # a Deployment too, with the chart's default failurePolicy (Fail): created, and its
        # pods made, gated from its template (they skip the pod webhook no one answers). The
        # PriorityClasses are the controller's to make: here, as one that ran before it went
        # down would have left them (with none, the API server refuses the pods)
        # (made where missing: a dev controller that ran earlier in the session owns them)
        classes = render_priority_classes()
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(classes), check=False)
        for made in classes:
            cluster.get("priorityclass", made["metadata"]["name"])  # each there
        serve = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "serve",
                "namespace": namespace,
                "labels": {"gpufleet.io/team": "nlp"},
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "serve"}},
                "template": {
                    "metadata": {"labels": {"app": "serve"}},
                    # the Job's pod spec, restarted as a Deployment's pods must be
                    "spec": {**body["spec"]["template"]["spec"], "restartPolicy": "Always"},
                },
            },
        }

        def deployment_held() -> bool:  # its policy is picked up in its own time, as above
            made = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(serve), check=False)
            assert made.returncode == 0, made.stderr
            held = cluster.get("deployment", "serve", "-n", namespace)["spec"]["template"]
            if held["spec"].get("schedulingGates"):
                return True
            cluster.kubectl("delete", "deployment", "serve", "-n", namespace, "--wait")
            return False

        cluster.wait_until(deployment_held, 30, "a Deployment held by the chart's policy")
        deployment = cluster.get("deployment", "serve", "-n", namespace)
        assert deployment["metadata"]["annotations"]["gpufleet.io/check"] == "true"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["gpufleet.io/workload"] == "deployment-serve"

        def pods_made_held() -> bool:
            selector = "gpufleet.io/workload=deployment-serve"
            listed = cluster.get("pods", "-n", namespace, "-l", selector)["items"]
            return len(listed) == 2 and all(
                {"name": "gpufleet.io/admission"} in p["spec"]["schedulingGates"] for p in listed
            )

        cluster.wait_until(pods_made_held, 30, "the Deployment's two pods, held")
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if dev.returncode == 0:
            restored = json.loads(dev.stdout)
            for field in ("resourceVersion", "uid", "creationTimestamp", "generation"):
                restored["metadata"].pop(field, None)
            cluster.kubectl("create", "-f", "-", input=json.dumps(restored))

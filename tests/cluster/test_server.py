"""`gpufleet server` on the real control plane with the real controller: tokens of two service
accounts with different RBAC are checked by the API server itself (TokenReview,
SubjectAccessReview); one sees its team's namespace only, one may cancel, and a cancelled
workload really stops. The dashboard is opened in headless Chromium against the live server:
every panel renders, no console error, its numbers are the API's; a screenshot is kept."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_report_browser import ARTIFACTS, run_browser

from gpufleet.api import models
from gpufleet.api.context import Conflict
from gpufleet.api.source import KubernetesActions
from gpufleet.client import ApiError, Client, Forbidden, Invalid, Timeout
from gpufleet.testing.cluster import ClusterError, ControlPlane

from .conftest import ControllerProcess, Scenario, ServerProcess, gpufleet_cli, job_manifest

PANELS = 14


class Fleet:
    """A pool, two teams in their own namespaces, their workloads, and two service accounts:
    `lead` may read GPU workloads in the nlp namespace only; `operator` may read everything
    the dashboard shows and cancel workloads anywhere."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.s = Scenario(cluster, nodes=2)
        self.nlp_ns = self.s.namespace
        self.vision_ns = f"{self.s.namespace}-vision"
        self.nlp = self.s.team("nlp")
        self.vision = self.s.team("vision", namespaces=[self.vision_ns])
        self.s.reserve(self.nlp, 8)
        self.s.apply()
        cluster.kubectl("create", "namespace", self.vision_ns)
        self.s.job("train", self.nlp, "reserved", 8)
        self.s.job("wait", self.nlp, "elastic", 8, pods=2)  # 16 GPUs do not fit beside train
        self.s.namespace = self.vision_ns
        self.s.job("eval", self.vision, "elastic", 4)
        self.s.namespace = self.nlp_ns
        self.cluster.wait_until(
            lambda: (
                self.state(self.nlp_ns, "train") == "Running"
                and self.state(self.vision_ns, "eval") == "Running"
                and self.state(self.nlp_ns, "wait") in ("Pending", "Preempted")
            ),
            90,
            "train and eval to run, wait to wait",
        )
        self.lead = self.account("lead", self.nlp_ns, "Role", [
            {"apiGroups": ["gpufleet.io"], "resources": ["gpuworkloads"],
             "verbs": ["get", "list", "watch"]},
        ])  # fmt: skip
        self.operator = self.account("operator", self.nlp_ns, "ClusterRole", [
            {"apiGroups": ["gpufleet.io"],
             "resources": ["gpupools", "teams", "reservations", "gpuworkloads", "clusters",
                           "gpuhosts"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["gpufleet.io"], "resources": ["gpuworkloads"], "verbs": ["delete"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["delete"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
        ])  # fmt: skip
        # may delete GPUWorkloads in nlp, not the Jobs they stand for
        self.half = self.account("half", self.nlp_ns, "Role", [
            {"apiGroups": ["gpufleet.io"], "resources": ["gpuworkloads"],
             "verbs": ["get", "list", "delete"]},
        ])  # fmt: skip

    def state(self, namespace: str, name: str) -> str | None:
        found = self.cluster.kubectl(
            "get", "gwl", name, "-n", namespace, "-o", "jsonpath={.status.state}", check=False
        )
        return found.stdout or None

    def account(self, name: str, namespace: str, kind: str, rules: list[dict[str, Any]]) -> str:
        role = f"{name}-{self.s.id}"
        binding_kind = "RoleBinding" if kind == "Role" else "ClusterRoleBinding"
        scoped = {"namespace": namespace} if kind == "Role" else {}
        self.cluster.apply(
            [
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": name, "namespace": namespace}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                 "metadata": {"name": role, **scoped}, "rules": rules},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind,
                 "metadata": {"name": role, **scoped},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                 "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
            ]
        )  # fmt: skip
        return self.cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()

    def delete(self) -> None:
        for ns in (self.nlp_ns, self.vision_ns):
            self.cluster.kubectl("delete", "jobs", "--all", "-n", ns, "--wait=false", check=False)
        for kind in ("clusterrolebinding", "clusterrole"):
            self.cluster.kubectl("delete", kind, f"operator-{self.s.id}", check=False)


@pytest.fixture(scope="module")
def fleet(cluster: ControlPlane, controller: ControllerProcess) -> Iterator[Fleet]:
    made = Fleet(cluster)
    yield made
    made.delete()


@pytest.fixture(scope="module")
def server(cluster: ControlPlane, fleet: Fleet) -> Iterator[ServerProcess]:
    process = ServerProcess(cluster)
    yield process
    process.stop()


def test_tokens_are_checked_by_the_cluster(server: ServerProcess, fleet: Fleet) -> None:
    assert httpx.get(f"{server.url}/api/v1/status").status_code == 401
    bad = httpx.get(f"{server.url}/api/v1/status", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "TokenReview" in bad.text
    with Client(server.url, token=fleet.lead) as lead:
        assert lead.whoami().user == f"system:serviceaccount:{fleet.nlp_ns}:lead"


def test_the_server_serves_https_with_the_certificate_given(
    cluster: ControlPlane, fleet: Fleet, tmp_path: Path
) -> None:
    from gpufleet.pki import create_ca, issue_serving_cert

    pki = create_ca(tmp_path / "pki")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    issue_serving_cert(pki.ca_cert, pki.ca_key, cert, key, ["127.0.0.1"])
    server = ServerProcess(
        cluster, f"--tls-cert-file={cert}", f"--tls-private-key-file={key}", ca=pki.ca_cert
    )
    try:
        answer = httpx.get(
            f"{server.url}/api/v1/whoami",
            headers={"Authorization": f"Bearer {fleet.lead}"},
            verify=ssl.create_default_context(cafile=str(pki.ca_cert)),
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["user"] == f"system:serviceaccount:{fleet.nlp_ns}:lead"
        assert answer.headers["Strict-Transport-Security"].startswith("max-age=")
        assert "server" not in answer.headers  # no software banner
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on its port
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
    finally:
        server.stop()


def test_a_team_lead_sees_their_namespace_only(server: ServerProcess, fleet: Fleet) -> None:
    with Client(server.url, token=fleet.lead) as lead:
        page = lead.workloads()
        assert {w.namespace for w in page.items} == {fleet.nlp_ns}
        assert {w.name for w in page.items} == {"train", "wait"}
        waiting = lead.workload(fleet.nlp_ns, "wait")
        assert waiting.state in ("Pending", "Preempted") and waiting.reason
        assert "waiting" in lead.explain(fleet.nlp_ns, "wait").text
        with pytest.raises(ApiError) as other:
            lead.workloads(namespace=fleet.vision_ns)
        assert other.value.status == 403
        assert other.value.missing is not None
        assert other.value.missing["namespace"] == fleet.vision_ns
        assert other.value.missing["resource"] == "gpuworkloads"
        with pytest.raises(ApiError) as capacity:
            lead.capacity()
        assert (
            capacity.value.status == 403 and "list gpupools.gpufleet.io" in capacity.value.message
        )
        with pytest.raises(ApiError) as cancel:
            lead.cancel(fleet.nlp_ns, "train")
        assert cancel.value.status == 403 and cancel.value.missing is not None
        assert cancel.value.missing["verb"] == "delete"
    assert fleet.state(fleet.nlp_ns, "train") == "Running"


def test_a_cancel_needs_the_callers_own_right_to_delete_the_job(
    server: ServerProcess, fleet: Fleet
) -> None:
    """The server deletes with its own service account: a caller who may delete the
    GPUWorkload but not its Job must not get the Job deleted through it."""
    with Client(server.url, token=fleet.half) as half, pytest.raises(ApiError) as denied:
        half.cancel(fleet.nlp_ns, "train")
    assert denied.value.status == 403 and denied.value.missing is not None
    missing = denied.value.missing
    assert (missing["verb"], missing["group"], missing["resource"], missing["namespace"]) == (
        "delete",
        "batch",
        "jobs",
        fleet.nlp_ns,
    )
    assert fleet.state(fleet.nlp_ns, "train") == "Running"


def test_a_cancel_deletes_only_the_object_of_its_uid(cluster: ControlPlane, fleet: Fleet) -> None:
    """A Job deleted and made again under its name is another Job: a cancel read from a cache
    that still holds the old uid deletes nothing."""
    from kubernetes import config

    workload = cluster.get("gwl", "train", "-n", fleet.nlp_ns)
    workload["spec"]["workloadRef"]["uid"] = str(uuid.uuid4())  # as a stale cache holds it
    actions = KubernetesActions(config.new_client_from_config(str(cluster.kubeconfig)))
    with pytest.raises(Conflict, match="nothing deleted"):
        actions.cancel(workload)
    assert fleet.state(fleet.nlp_ns, "train") == "Running"
    assert cluster.kubectl("get", "job", "train", "-n", fleet.nlp_ns, check=False).returncode == 0


def test_what_a_gpu_workload_stands_for_cannot_change(cluster: ControlPlane, fleet: Fleet) -> None:
    """A cancel deletes what spec.workloadRef names and a bare pod is made again from
    spec.podTemplate, both with gpufleet's own rights: the API server keeps them as created."""
    for patch, rule in (
        ({"spec": {"workloadRef": {"name": "someone-elses"}}}, "spec.workloadRef cannot change"),
        ({"spec": {"podTemplate": {"spec": {"hostPID": True}}}}, "spec.podTemplate cannot"),
    ):
        changed = cluster.kubectl(
            "patch", "gwl", "train", "-n", fleet.nlp_ns, "--type=merge", "-p", json.dumps(patch),
            check=False,
        )  # fmt: skip
        assert changed.returncode != 0 and rule in changed.stderr, changed.stderr
    ref = cluster.get("gwl", "train", "-n", fleet.nlp_ns)["spec"]["workloadRef"]
    assert ref["name"] == "train"


def test_the_api_reports_what_the_cluster_holds(
    cluster: ControlPlane, server: ServerProcess, fleet: Fleet
) -> None:
    with Client(server.url, token=fleet.operator) as operator:
        pools = {p.pool: p for p in operator.pools()}
        written = cluster.get("gpupool", fleet.s.pool)["status"]

        def matches() -> bool:
            pool = {p.pool: p for p in operator.pools()}[fleet.s.pool]
            return pool.allocated_gpus == 12 and pool.allocated_gpus == written["allocatedGPUs"]

        cluster.wait_until(matches, 30, "the pool's numbers in the API")
        pool = pools[fleet.s.pool]
        assert (pool.total_gpus, pool.reserved_gpus, pool.gpu_type) == (16, 8, "H100")
        teams = {t.name: t for t in operator.teams()}
        assert (teams[fleet.nlp].reserved_gpus, teams[fleet.nlp].waiting) == (8, 1)
        names = {(w.namespace, w.name) for w in operator.workloads(limit=10_000).items}
        assert {(fleet.nlp_ns, "train"), (fleet.vision_ns, "eval")} <= names
        nodes = {n.node for n in operator.nodes()}
        assert set(fleet.s.nodes) <= nodes


def test_the_dashboard_renders_in_chromium_with_the_api_numbers(
    server: ServerProcess, fleet: Fleet, tmp_path: Path
) -> None:
    with Client(server.url, token=fleet.operator) as operator:
        capacity = operator.capacity()
        node_count = len(operator.nodes())
        waiting = operator.workloads(state="Pending,Preempted", limit=200).total
    page = f"{server.url}/#token={fleet.operator}"
    dom = run_browser(["--dump-dom", "--virtual-time-budget=8000"], page, tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert f'data-panels-ok="{PANELS}"' in html, html[:1500]
    assert "data-error=" not in html  # no panel failed to load
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert any(f"{PANELS} of {PANELS} panels rendered" in line for line in console), dom.stderr
    assert [line for line in console if re.search(r"Uncaught|\bError\b|Failed to", line)] == []
    totals = capacity.totals
    assert f'id="total-gpus">{totals.total_gpus}<' in html
    assert f'id="healthy-gpus">{totals.healthy_gpus}<' in html
    assert f'data-pool="{fleet.s.pool}"' in html and f'data-team-row="{fleet.nlp}"' in html
    assert len(re.findall(r'<tr id="node-[^"$]+"', html)) == node_count
    # each waiting one is linked in the queue (the script's own text has ${...} in its place)
    assert len(re.findall(r'data-workload="[^"$]+"', html)) >= waiting
    assert "system:serviceaccount" in html  # who is signed in
    assert "this server has no usage ledger" in html  # the cost panel says why it is empty
    assert "One cluster: no Cluster is declared" in html  # the Clusters panel, of one cluster

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    result = run_browser(
        [f"--screenshot={shot}", "--window-size=1400,1500", "--hide-scrollbars",
         "--virtual-time-budget=8000"],
        page, tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page compresses to far less


def test_a_cancelled_workload_really_stops(
    cluster: ControlPlane, server: ServerProcess, fleet: Fleet
) -> None:
    with Client(server.url, token=fleet.operator) as operator:
        done = operator.cancel(fleet.vision_ns, "eval")
        assert "Job eval deleted" in done.message

    def gone() -> bool:
        jobs = cluster.kubectl("get", "job", "eval", "-n", fleet.vision_ns, check=False)
        pods = cluster.kubectl(
            "get", "pods", "-n", fleet.vision_ns, "-l", "job-name=eval", "-o", "name"
        )
        return jobs.returncode != 0 and pods.stdout.strip() == ""

    cluster.wait_until(gone, 60, "the cancelled Job and its pods to be gone")
    cluster.wait_until(
        lambda: fleet.state(fleet.vision_ns, "eval") is None, 60, "its GPUWorkload to go"
    )
    with Client(server.url, token=fleet.operator) as operator:
        cluster.wait_until(
            lambda: all(w.name != "eval" for w in operator.workloads(limit=10_000).items),
            30,
            "the server's cache to drop it",
        )


def test_a_quarantined_node_is_released_through_the_api(
    cluster: ControlPlane, server: ServerProcess, fleet: Fleet
) -> None:
    (node,) = cluster.add_gpu_nodes(1, 8, "H100", pool=fleet.s.pool, prefix=f"{fleet.s.pool}-q")
    cluster.kubectl("taint", "node", node, "gpufleet.io/gpu-unhealthy=true:NoSchedule")
    with Client(server.url, token=fleet.lead) as lead, pytest.raises(ApiError) as denied:
        lead.release_node(node)
    assert denied.value.status == 403 and denied.value.missing is not None
    assert (denied.value.missing["verb"], denied.value.missing["resource"]) == ("patch", "nodes")
    with Client(server.url, token=fleet.operator) as operator:
        cluster.wait_until(
            lambda: any(n.node == node and n.quarantined for n in operator.nodes()),
            30,
            "the server to see the quarantine",
        )
        assert "release of node" in operator.release_node(node).message
        with pytest.raises(ApiError) as twice:
            operator.release_node(fleet.s.nodes[0])  # not quarantined: nothing to release
        assert twice.value.status == 409

    def released() -> bool:
        found = cluster.get("node", node)
        taints = found["spec"].get("taints") or []
        by = found["metadata"].get("annotations", {}).get("gpufleet.io/released-manually", "")
        return not any(t["key"] == "gpufleet.io/gpu-unhealthy" for t in taints) and (
            f"system:serviceaccount:{fleet.nlp_ns}:operator" in by
        )

    cluster.wait_until(released, 60, "the health controller to apply the release")


def test_a_submit_creates_the_job_as_the_caller_and_waits_for_it(
    cluster: ControlPlane, server: ServerProcess, fleet: Fleet
) -> None:
    """`submitter` may create Jobs (and read GPU workloads) in its own namespace only: its
    submission through the SDK is made as it (the API server's audit log names it, the
    server's identity only as the one who acted for it), the same call for another namespace
    is refused with the API server's reason, and its wait ends when the Job completes."""
    s = Scenario(cluster, nodes=1)
    try:
        team = s.team("exp")
        s.reserve(team, 8)
        s.apply()
        token = fleet.account("submitter", s.namespace, "Role", [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
            {"apiGroups": ["gpufleet.io"], "resources": ["gpuworkloads"], "verbs": ["get"]},
        ])  # fmt: skip
        me = f"system:serviceaccount:{s.namespace}:submitter"
        states: list[str] = []
        with Client(server.url, token=token) as client:
            made = client.submit_job(
                s.namespace, name="quick", team=team, workload_class="reserved", gpus=8,
                image="busybox", command=["true"], run_for="3s", external_id="exp-7",
            )  # fmt: skip
            assert made.uid and made.created_by == me and made.workload == "quick"
            job = cluster.get("job", "quick", "-n", s.namespace)
            assert job["metadata"]["uid"] == made.uid
            assert job["metadata"]["annotations"]["gpufleet.io/external-id"] == "exp-7"
            (event,) = [
                e
                for e in cluster.audited()
                if e["objectRef"].get("namespace") == s.namespace and e["verb"] == "create"
            ]
            assert event["impersonatedUser"]["username"] == me
            assert event["user"]["username"] != me  # the server, acting for the submitter
            assert event["responseStatus"]["code"] == 201

            with pytest.raises(Forbidden) as denied:
                client.submit_job(fleet.vision_ns, name="quick", team=fleet.vision, image="busybox")
            assert denied.value.status == 403
            assert f'User "{me}" cannot create resource "jobs"' in denied.value.message
            assert cluster.kubectl("get", "job", "quick", "-n", fleet.vision_ns,
                                   check=False).returncode != 0  # fmt: skip

            done = client.wait_for_completion(
                s.namespace, made.workload, timeout=120,
                progress=lambda w: states.append(w.state),
            )  # fmt: skip
            assert done.state == "Completed" and states[-1] == "Completed"
            # the CLI's wait says the same, from the cluster itself
            waited = gpufleet_cli(cluster, "workloads", "wait", "quick", "-n", s.namespace)
            assert waited == ""  # its changes go to stderr

            # from a template kept in the cluster (as GitOps applies it)
            template = {
                "apiVersion": "gpufleet.io/v1alpha1", "kind": "WorkloadTemplate",
                "metadata": {"name": f"short-{s.id}"},
                "spec": {"image": "busybox", "gpus": 8, "class": "reserved", "team": team,
                         "memory": "1Gi", "command": ["sleep", "1"]},
            }  # fmt: skip
            cluster.apply([template])
            listed = json.loads(gpufleet_cli(cluster, "templates", "-o", "json"))
            assert {"name": f"short-{s.id}", "memory": "1Gi"}.items() <= next(
                t for t in listed if t["name"] == f"short-{s.id}"
            ).items()

            def from_template() -> models.Submitted | None:
                try:
                    return client.submit_job(s.namespace, name="from-template",
                                             template=f"short-{s.id}", dry_run=True)  # fmt: skip
                except Invalid as err:  # until the server's watch has brought the template
                    assert "does not exist" in err.message, err.message
                    return None

            cluster.wait_until(lambda: from_template() is not None, 30, "the server to see it")
            planned = from_template()
            assert planned is not None
            (container,) = planned.manifest["spec"]["template"]["spec"]["containers"]
            assert container["resources"]["requests"]["memory"] == "1Gi"
            assert container["command"] == ["sleep", "1"]
            dry = json.loads(gpufleet_cli(cluster, "submit", "cli-template", "--team", team,
                                          "--template", f"short-{s.id}", "-n", s.namespace,
                                          "--gpus", "4", "--dry-run", "-o", "json"))  # fmt: skip
            (container,) = dry["spec"]["template"]["spec"]["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
            assert dry["metadata"]["labels"]["gpufleet.io/class"] == "reserved"
            cluster.kubectl("delete", "workloadtemplate", f"short-{s.id}")

            long = client.submit_job(
                s.namespace, name="long", team=team, gpus=8, image="busybox", run_for="3600s"
            )
            with pytest.raises(Timeout) as late:
                client.wait_for_completion(s.namespace, long.workload, timeout=3)
            assert "did not finish in time" in late.value.message
            cli = subprocess.run(
                [sys.executable, "-m", "gpufleet", "workloads", "wait", "long", "-n",
                 s.namespace, "--timeout", "2s", f"--kubeconfig={cluster.kubeconfig}"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert cli.returncode == 1 and "did not finish within 2s" in cli.stderr

            # who submitted each is the API server's word, not the manifest's
            labels = {"gpufleet.io/team": team, "gpufleet.io/class": "elastic"}
            forged = job_manifest("forged", s.namespace, labels, 1, 1, "1s")  # it waits
            forged["metadata"]["annotations"] = {"gpufleet.io/submitter": me}
            cluster.apply([forged])
            admin = cluster.kubectl(
                "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"
            ).stdout
            cluster.wait_until(
                lambda: fleet.state(s.namespace, "forged") is not None, 60, "forged's workload"
            )
            assert cluster.get("gwl", "forged", "-n", s.namespace)["spec"]["submitter"] == admin
            with Client(server.url, token=fleet.operator) as operator:
                mine = operator.workloads(namespace=s.namespace, submitter=me).items
                assert {w.name for w in mine} == {"quick", "long"}
                assert all(w.submitter == me for w in mine)
                theirs = operator.workloads(namespace=s.namespace, submitter=admin).items
                assert [w.name for w in theirs] == ["forged"]
                listed = json.loads(gpufleet_cli(
                    cluster, "workloads", "list", "-n", s.namespace, "--submitter", me, "-o",
                    "json",
                ))  # fmt: skip
                assert {w["name"] for w in listed} == {"quick", "long"}

                # a workload's events: the Job controller's and those of its running pod (an
                # admission at once records none; one after a wait does)
                def reasons(name: str) -> set[tuple[str, str]]:
                    found = operator.workload_events(s.namespace, name)
                    return {(e.object.split("/")[0], e.reason) for e in found}

                wanted = {("Job", "SuccessfulCreate"), ("Pod", "Scheduled")}
                try:
                    cluster.wait_until(lambda: wanted <= reasons("long"), 60, "long's events")
                except ClusterError:
                    pytest.fail(f"long's events: {reasons('long')}, not all of {wanted}")
                assert all(e.object in ("Job/long", "GPUWorkload/long")
                           or e.object.startswith("Pod/long-")
                           for e in operator.workload_events(s.namespace, "long"))  # fmt: skip
                assert ("Job", "Completed") in reasons("quick")
                shown = json.loads(gpufleet_cli(cluster, "workloads", "events", "long", "-n",
                                                s.namespace, "-o", "json"))  # fmt: skip
                assert {"SuccessfulCreate", "Scheduled"} <= {e["reason"] for e in shown}
                # its logs: its pod is found, and kwok's node (no kubelet) says it has none
                logs = subprocess.run(
                    [sys.executable, "-m", "gpufleet", "workloads", "logs", "long", "-n",
                     s.namespace, f"--kubeconfig={cluster.kubeconfig}"],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                assert logs.returncode == 1, logs
                assert "cannot read the logs of pod/long-" in logs.stderr, logs.stderr
            with pytest.raises(Forbidden) as no_events:  # may get the workload, not its events
                client.workload_events(s.namespace, "quick")
            assert (no_events.value.missing or {}).get("resource") == "events"
    finally:
        s.cleanup()


def test_filters_and_pages_return_exactly_the_matching_workloads_of_2000(
    cluster: ControlPlane, server: ServerProcess, fleet: Fleet
) -> None:
    """2,000 GPU workloads in the real API server (made directly: no Jobs, so no controller
    touches them), of two teams, states and submitters; the server's watch brings them in, and
    the SDK's cursor pages (as the operator, through real TokenReview and RBAC) return exactly
    the ones each filter keeps, each once."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client, config

    namespace = f"many-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    custom = client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))
    states = ("Running", "Pending", "Completed", "Preempted")
    wanted: dict[str, tuple[str, str, str]] = {}

    def make(i: int) -> None:
        name = f"w-{i:04d}"
        team = "nlp" if i % 2 else "vision"
        state, submitter = states[i % 4], f"user-{i % 3}"
        wanted[name] = (team, state, submitter)
        body = {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "GPUWorkload",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"team": team, "class": "elastic", "gpus": 1, "submitter": submitter,
                     "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": f"uid-{i}"}},
            "status": {"state": state},  # (a GPUWorkload's status is no subresource)
        }  # fmt: skip
        custom.create_namespaced_custom_object("gpufleet.io", "v1alpha1", namespace,
                                               "gpuworkloads", body)  # fmt: skip

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(2_000)))
        with Client(server.url, token=fleet.operator) as operator:
            cluster.wait_until(
                lambda: operator.workloads(namespace=namespace, limit=1).total == 2_000,
                60, "the server's watch to hold the 2,000",
            )  # fmt: skip
            for filters in (
                {"team": "nlp", "state": "Running,Pending"},
                {"submitter": "user-1", "state": "Completed"},
                {"search": "W-01"},  # names holding it, any case: w-0100 ... w-0199
                {},
            ):
                seen = [w.name for w in operator.iter_workloads(
                    namespace=namespace, page_size=97, **filters)]  # fmt: skip
                keeps = {
                    name for name, (team, state, submitter) in wanted.items()
                    if filters.get("team", team) == team
                    and state in filters.get("state", state).split(",")
                    and filters.get("submitter", submitter) == submitter
                    and filters.get("search", "").lower() in name
                }  # fmt: skip
                assert len(seen) == len(set(seen)) and set(seen) == keeps, filters
                assert seen == sorted(seen)  # in name order, page after page
            stats = operator.workload_stats(namespace=namespace)
            assert {c.key: c.workloads for c in stats.by_state} == dict.fromkeys(states, 500)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")

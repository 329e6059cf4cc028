"""The controllers on the real control plane: the worked examples of DESIGN §4 with real Jobs,
and admission with and without `requireTeam`.

Each test brings its own pool (its own fake nodes, labelled with the pool), teams and
reservations, and removes them at the end; the GitOps kinds are cluster-scoped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from engine_helpers import gitops

from gpufleet.kube.chart import check_rules
from gpufleet.kube.observe import held, parse_time
from gpufleet.ledger.store import open_ledger
from gpufleet.testing.cluster import ControlPlane

from .conftest import API, ControllerProcess, gpufleet_cli, policy_params


def test_observe_mode_without_gpupools(
    cluster: ControlPlane, controller: ControllerProcess, gpu_nodes: list[str]
) -> None:
    cluster.kubectl("delete", "gpupools", "--all")  # tests run one at a time; none is in use
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "status",
            "-o",
            "json",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["observeMode"] is True
    h100 = next(p for p in status["pools"] if p["gpuType"] == "NVIDIA-H100-80GB-HBM3")
    assert h100["pool"] == "observed-nvidia-h100-80gb-hbm3"
    assert h100["totalGPUs"] >= 8 * len(gpu_nodes)


def test_example_1_reserved_job_reclaims_elastic_gpus_which_resume_later(scenario: Any) -> None:
    s = scenario(4)
    nlp = s.team("nlp")
    s.reserve(nlp, 32)
    s.apply()
    for name, cls, gpus, pods, run_for in (
        ("pretrain", "reserved", 8, 2, "600s"),
        ("finetune", "reserved", 4, 1, "600s"),
        ("sweep", "elastic", 4, 1, "25s"),
        ("ablation", "elastic", 8, 1, "25s"),
    ):
        assert s.job(name, nlp, cls, gpus, pods, run_for=run_for).returncode == 0
    s.wait_states(
        {"pretrain": "Running", "finetune": "Running", "sweep": "Running", "ablation": "Running"}
    )
    assert s.job("urgent", nlp, "reserved", 4, pods=3, run_for="8s").returncode == 0
    s.wait_states({"urgent": "Running", "sweep": "Preempted", "ablation": "Preempted"})
    assert s.state("pretrain") == s.state("finetune") == "Running"
    assert "Preempted" in s.events("sweep")
    # once the reserved job is done, the preempted elastic jobs come back on their own and run
    # to completion (their pods start over: 25s each)
    s.wait_states({"urgent": "Completed", "sweep": "Running", "ablation": "Running"}, 90)
    s.wait_states({"sweep": "Completed", "ablation": "Completed"}, 90)
    workload = s.cluster.get("gwl", "sweep", "-n", s.namespace)
    assert workload["status"]["preemptions"] == 1
    for name in ("sweep", "ablation"):
        # the pods deleted at the preemption (by gpufleet or the Job controller, whichever came
        # first) counted as neither failed nor succeeded: one pod of each succeeded, in all
        # (gpufleet says Completed when the pods have; the Job controller a moment later)
        s.cluster.wait_until(
            lambda name=name: s.cluster.get("job", name, "-n", s.namespace)["status"].get(
                "succeeded"
            ),
            30,
            f"the Job controller counting {name}'s pod",
        )
        status = s.cluster.get("job", name, "-n", s.namespace)["status"]
        assert status.get("failed", 0) == 0 and status["succeeded"] == 1, (name, status)


def test_r6_borrowers_resume_as_soon_as_the_reserved_job_releases_the_gpus(scenario: Any) -> None:
    """Under the default FleetPolicy (10m back-off) an elastic Job preempted by a reserved Job
    waits with reason BackOff only while that Job holds the GPUs; when it finishes the elastic
    Job runs again within seconds, not after the back-off."""
    s = scenario(2)
    owner, borrower = s.team("owner"), s.team("borrower")
    s.reserve(owner, 8)
    s.apply()
    for name in ("lend-a", "lend-b"):
        s.job(name, borrower, "elastic", 8)
    s.wait_states({"lend-a": "Running", "lend-b": "Running"})
    s.job("urgent", owner, "reserved", 8, run_for="10s")
    s.wait_states({"urgent": "Running"})
    victim = next(n for n in ("lend-a", "lend-b") if s.state(n) == "Preempted")
    status = s.cluster.get("gwl", victim, "-n", s.namespace)["status"]
    assert status["preemptedBy"] == f"{s.namespace}/urgent"
    s.cluster.wait_until(
        lambda: (
            s.cluster.get("gwl", victim, "-n", s.namespace)["status"].get("reason") == "BackOff"
        ),
        20,
        f"{victim} waiting with reason BackOff",
    )
    s.wait_states({"urgent": "Completed"}, 60)
    s.wait_states({victim: "Running"}, 20)  # the back-off window alone would be 10 minutes


def test_example_2_higher_priority_elastic_displaces_lower(scenario: Any) -> None:
    s = scenario(2)
    serving, team_a, team_b = s.team("serving"), s.team("team-a"), s.team("team-b")
    s.reserve(serving, 8)
    # the sweep starts moments before the deadline job; the worked example's sweep had been
    # running for a while, past the 5m thrash guard
    s.policy(preemption={"minRuntime": "1s"})
    s.apply()
    s.job("serving", serving, "reserved", 8)
    s.job("sweep", team_a, "elastic", 1, pods=8, priority="50")
    s.wait_states({"serving": "Running", "sweep": "Running"})
    s.job("deadline", team_b, "elastic", 8, priority="high")
    s.wait_states({"deadline": "Running", "sweep": "Preempted", "serving": "Running"})


def test_example_3_idle_reservation_is_lent_without_preemption(scenario: Any) -> None:
    s = scenario(4)
    vision, nlp = s.team("vision"), s.team("nlp")
    s.reserve(vision, 16)
    s.reserve(nlp, 16)
    s.apply()
    s.job("detector", vision, "reserved", 4)
    s.job("llm", nlp, "reserved", 8, pods=2)
    s.wait_states({"detector": "Running", "llm": "Running"})
    s.job("segmenter", vision, "elastic", 8)
    s.wait_states({"segmenter": "Running"})
    assert all(s.state(n) == "Running" for n in ("detector", "llm"))
    assert "Preempted" not in s.cluster.kubectl("get", "gwl", "-n", s.namespace).stdout


def test_example_4_exactly_the_needed_gpus_are_reclaimed(scenario: Any) -> None:
    s = scenario(10)
    research, production = s.team("research"), s.team("production")
    s.reserve(research, 48)
    s.reserve(production, 32)
    s.apply()
    s.job("research-a", research, "reserved", 8, pods=2)
    s.job("research-b", research, "reserved", 4)
    s.job("prod-serving", production, "reserved", 8, pods=4)
    s.wait_states({"research-a": "Running", "research-b": "Running", "prod-serving": "Running"})
    s.job("prod-small", production, "elastic", 4)
    for i in (1, 2, 3):
        s.job(f"prod-batch-{i}", production, "elastic", 8)
    s.wait_states({"prod-small": "Running", **{f"prod-batch-{i}": "Running" for i in (1, 2, 3)}})
    s.job("research-big", research, "reserved", 8, pods=3)
    s.wait_states(
        {"research-big": "Running", **{f"prod-batch-{i}": "Preempted" for i in (1, 2, 3)}}
    )
    # 24 of production's 28 elastic GPUs, no more: the 4-GPU job and all reserved work stay
    assert s.state("prod-small") == "Running"
    assert s.state("prod-serving") == "Running"


def test_require_team(cluster: ControlPlane, scenario: Any) -> None:
    s = scenario(1)
    s.team("someone", namespaces=[])  # its namespace is no team's
    policy: dict[str, Any] = {
        "apiVersion": API,
        "kind": "FleetPolicy",
        "metadata": {"name": f"p-{s.id}"},
        "spec": {"admission": {"requireTeam": True}},
    }
    s.objects.append(policy)
    s.apply()
    # the API server's holding policy follows the fleet within a controller cycle
    cluster.wait_until(
        lambda: policy_params(cluster).get("requireTeam") == "true", 30, "the params"
    )

    def plain_job(name: str, gpus: int) -> subprocess.CompletedProcess[str]:
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": s.namespace},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "c", "image": "x", "resources": {"limits": limits}}
                        ],
                    }
                }
            },
        }
        return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)

    rejected = plain_job("no-team", 2)
    assert rejected.returncode != 0
    assert "belongs to no team: add the label gpufleet.io/team=<team>" in rejected.stderr
    cpu_only = plain_job("cpu-only", 0)
    assert cpu_only.returncode == 0
    job = cluster.get("job", "cpu-only", "-n", s.namespace)
    assert "gpufleet.io/managed" not in (job["metadata"].get("annotations") or {})
    assert not job["spec"].get("suspend")
    assert not job["spec"]["template"]["spec"].get("schedulingGates")
    bad_team = s.job("bad", "nobody", "elastic", 1)
    assert bad_team.returncode != 0
    assert "team 'nobody' does not exist" in bad_team.stderr
    # without requireTeam (the default), a GPU Job without a team runs untouched
    cluster.kubectl("delete", "fleetpolicy", policy["metadata"]["name"])
    s.objects.remove(policy)
    cluster.wait_until(
        lambda: policy_params(cluster).get("requireTeam") == "false", 30, "the params"
    )
    assert plain_job("no-team", 2).returncode == 0
    job = cluster.get("job", "no-team", "-n", s.namespace)
    assert not job["spec"].get("suspend")
    assert not job["spec"]["template"]["spec"].get("schedulingGates")
    assert "gpufleet.io/managed" not in (job["metadata"].get("annotations") or {})


def test_status_and_derived_objects(
    cluster: ControlPlane, scenario: Any, shared_crds: Path
) -> None:
    cluster.install_crds([shared_crds])  # Karpenter and KAI present: their objects are rendered
    s = scenario(2)
    nlp = s.team("nlp", burstingPriority=3)
    s.reserve(nlp, 8)
    aws_pool = f"aws-{s.id}"
    s.objects.append(
        {
            "apiVersion": API,
            "kind": "GPUPool",
            "metadata": {"name": aws_pool},
            "spec": {
                "provider": "aws",
                "gpuType": "H100",
                "gpusPerNode": 8,
                "maxGPUs": 16,
                "instanceTypes": ["p5.48xlarge"],
                "aws": {"amiAlias": "al2023@v20251112"},
            },
        }
    )
    foreign = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": f"foreign-{s.id}"},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.k8s.aws",
                        "kind": "EC2NodeClass",
                        "name": "x",
                    },
                    "requirements": [],
                }
            }
        },
    }
    cluster.apply([foreign])
    s.apply()
    s.job("train", nlp, "elastic", 8, pods=2)
    s.wait_states({"train": "Running"})

    def status(kind: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = cluster.get(kind, name).get("status") or {}
        return found

    cluster.wait_until(
        lambda: status("gpupool", s.pool).get("allocatedGPUs") == 16, 30, "pool status"
    )
    assert status("gpupool", s.pool) == {
        "totalGPUs": 16,
        "allocatableGPUs": 16,
        "healthyGPUs": 16,
        "allocatedGPUs": 16,
        "idleGPUs": 0,
    }
    cluster.wait_until(lambda: status("team", nlp).get("usedGPUs") == 16, 30, "team status")
    assert status("team", nlp) == {"reservedGPUs": 8, "usedGPUs": 16, "borrowedGPUs": 8}
    assert status("reservation", f"{nlp}-{s.pool}") == {
        "reservedGPUs": 8,
        "usedGPUs": 8,
        "borrowedGPUs": 8,
        "expired": False,
    }
    # derived objects: a NodePool + EC2NodeClass for the aws pool, a KAI Queue for the team
    cluster.wait_until(
        lambda: cluster.kubectl("get", "nodepool", aws_pool, check=False).returncode == 0,
        30,
        "NodePool",
    )
    nodepool = cluster.get("nodepool", aws_pool)
    assert nodepool["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
    assert nodepool["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    queue = cluster.get("queues.scheduling.run.ai", nlp)
    assert queue["spec"]["resources"]["gpu"]["quota"] == 8
    # the pool leaves git: its objects are pruned; the foreign NodePool is not ours to touch
    cluster.kubectl("delete", "gpupool", aws_pool)
    s.objects = [o for o in s.objects if o["metadata"]["name"] != aws_pool]
    cluster.wait_until(
        lambda: cluster.kubectl("get", "nodepool", aws_pool, check=False).returncode != 0,
        30,
        "pruning",
    )
    assert cluster.kubectl("get", "ec2nodeclass", aws_pool, check=False).returncode != 0
    assert cluster.kubectl("get", "nodepool", f"foreign-{s.id}", check=False).returncode == 0
    cluster.kubectl("delete", "nodepool", f"foreign-{s.id}", "--wait=false")


def test_crash_in_the_middle_of_a_preemption_loses_nothing(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    s = scenario(4)
    nlp = s.team("nlp")
    s.reserve(nlp, 32)
    s.apply()
    for name, cls, gpus, pods in (
        ("pretrain", "reserved", 8, 2),
        ("finetune", "reserved", 4, 1),
        ("sweep", "elastic", 4, 1),
        ("ablation", "elastic", 8, 1),
    ):
        s.job(name, nlp, cls, gpus, pods)
    s.wait_states(
        {"pretrain": "Running", "finetune": "Running", "sweep": "Running", "ablation": "Running"}
    )
    s.job("urgent", nlp, "reserved", 4, pods=3)
    # crash as soon as the preemption has begun: some victims may have lost their pods, others not,
    # and the reserved job may or may not be admitted yet
    cluster.wait_until(
        lambda: (
            "Preempted" in (s.state("sweep"), s.state("ablation"))
            or s.state("urgent") not in (None, "Pending")
        ),
        30,
        "the preemption",
    )
    controller.kill()
    controller.start()
    s.wait_states(
        {
            "urgent": "Running",
            "sweep": "Preempted",
            "ablation": "Preempted",
            "pretrain": "Running",
            "finetune": "Running",
        },
        60,
    )
    victims = ("sweep", "ablation")

    def live_pods() -> list[dict[str, Any]]:
        """Pods that hold or may take GPUs: not finished, not being deleted, not held."""
        return [
            p
            for p in cluster.get("pods", "-n", s.namespace)["items"]
            if p["status"].get("phase") in ("Pending", "Running")
            and not p["metadata"].get("deletionTimestamp")
            and not held(p)
        ]

    # the preempted Jobs lose their pods once their record is written
    cluster.wait_until(
        lambda: not [p for p in live_pods() if p["metadata"]["labels"].get("job-name") in victims],
        30,
        "the preempted Jobs' pods to go",
    )
    # nothing admitted twice: every node holds at most its 8 GPUs, every Job its pods
    live = live_pods()
    per_node: dict[str, int] = {}
    for pod in live:
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        node = pod["spec"].get("nodeName", "unbound")
        per_node[node] = per_node.get(node, 0) + gpus
    assert all(v <= 8 for k, v in per_node.items() if k != "unbound"), per_node
    jobs = {j["metadata"]["name"]: j for j in cluster.get("jobs", "-n", s.namespace)["items"]}
    for name, job in jobs.items():
        mine = [p for p in live if p["metadata"]["labels"].get("job-name") == name]
        assert len(mine) <= job["spec"]["parallelism"], name
    # none suspended: the preempted ones' pods were deleted uncounted (none failed), and
    # the pods the Job controller made again wait at the gate
    assert not [n for n, j in jobs.items() if j["spec"].get("suspend")]
    assert not [n for n in victims if jobs[n].get("status", {}).get("failed")]
    assert all(
        held(p)
        for p in cluster.get("pods", "-n", s.namespace)["items"]
        if p["metadata"]["labels"].get("job-name") in victims
        and not p["metadata"].get("deletionTimestamp")
    )
    workloads = cluster.get("gwl", "-n", s.namespace)["items"]
    assert {w["metadata"]["name"] for w in workloads} == set(jobs)  # none lost, none doubled
    # the usage ledger lost and doubled nothing either: the restarted controller reconciles it
    # with the cluster, so each running Job has exactly one open run segment, starting when its
    # GPUWorkload says it was admitted, and the preempted ones none
    admitted = {
        w["spec"]["workloadRef"]["uid"]: parse_time(w["status"].get("admittedAt"))
        for w in workloads
        if w["status"]["state"] == "Running"
    }
    preempted = {w["spec"]["workloadRef"]["uid"] for w in workloads} - set(admitted)

    def ledger_agrees() -> bool:
        store = open_ledger(controller.ledger, create=False)
        try:
            now = datetime.now(UTC)
            rows = [r for r in store.segments(now - timedelta(days=1), now) if r.pool == s.pool]
        finally:
            store.close()
        running = {r.uid: r.start for r in rows if r.end is None}
        finished = {r.uid for r in rows if r.outcome == "preempted"}
        return running == admitted and preempted <= finished

    cluster.wait_until(ledger_agrees, 30, "the ledger to agree with the cluster")


def test_an_admission_onto_gpus_its_victim_still_holds_is_undone(
    cluster: ControlPlane, scenario: Any
) -> None:
    """The state a crash in the middle of a preemption can leave, made on purpose: the victim's
    pods cannot be deleted (an admission policy refuses it), so the reserved Job is recorded
    as admitted onto GPUs the victim still runs on. The controller undoes that admission
    instead of leaving the reserved Job out of every cycle; once the victim's pods may go, the
    Job runs, admitted once."""
    s = scenario(1)
    nlp = s.team("nlp")
    s.reserve(nlp, 8)
    s.apply()
    s.job("borrower", nlp, "elastic", 8)
    s.wait_states({"borrower": "Running"})
    name = f"keep-{s.id}"
    policy = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["DELETE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [{"expression": "false", "message": "kept by the test"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": s.namespace}
                    },
                    "objectSelector": {"matchLabels": {"job-name": "borrower"}},
                },
            },
        },
    ]
    cluster.apply(policy)
    try:
        (pod,) = cluster.get("pods", "-n", s.namespace, "-l", "job-name=borrower")["items"]

        def kept() -> bool:
            tried = cluster.kubectl(
                "delete", "pod", pod["metadata"]["name"], "-n", s.namespace,
                "--dry-run=server", check=False,
            )  # fmt: skip
            return "kept by the test" in tried.stderr

        cluster.wait_until(kept, 30, "the API server to apply the policy")
        s.job("urgent", nlp, "reserved", 8)
        cluster.wait_until(
            lambda: "still held by work that was to make room for it" in s.events("urgent"),
            60,
            "the admission to be undone (event Requeued)",
        )
    finally:
        cluster.kubectl("delete", "-f", "-", input=yaml.safe_dump_all(policy), check=False)
    s.wait_states({"urgent": "Running", "borrower": "Preempted"}, 60)
    running = [
        p
        for p in cluster.get("pods", "-n", s.namespace)["items"]
        if p["status"].get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
        and not held(p)
    ]
    assert [p["metadata"]["labels"]["job-name"] for p in running] == ["urgent"]


def test_live_cli(cluster: ControlPlane, scenario: Any) -> None:
    s = scenario(1)
    nlp = s.team("nlp")
    s.reserve(nlp, 8)
    s.apply()
    s.job("first", nlp, "reserved", 8)
    s.wait_states({"first": "Running"})
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "submit",
            "second",
            "--team",
            nlp,
            "--gpus",
            "8",
            "-n",
            s.namespace,
            "--run-for",
            "600s",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    cluster.wait_until(
        lambda: (
            cluster.get("gwl", "second", "-n", s.namespace).get("status", {}).get("reason")
            == "PoolFull"
        ),
        30,
        "a waiting reason",
    )

    def gpufleet(*args: str) -> str:
        return gpufleet_cli(cluster, *args)

    status = json.loads(gpufleet("status", "-o", "json"))
    pool = next(p for p in status["pools"] if p["pool"] == s.pool)
    assert pool["allocatedGPUs"] == 8 and pool["idleGPUs"] == 0
    assert status["queueDepth"][nlp] == 1
    capacity = json.loads(gpufleet("capacity", "-o", "json"))
    live_pool = next(p for p in capacity["pools"] if p["name"] == s.pool)
    assert live_pool["reserved_gpus"] == 8 and live_pool["allocated_gpus"] == 8
    live_team = next(t for t in capacity["teams"] if t["name"] == nlp)
    assert live_team["used_gpus"] == 8 and live_team["borrowed_gpus"] == 0
    listed = gpufleet("workloads", "list", "-n", s.namespace)
    assert "second" in listed and "PoolFull" in listed
    explained = gpufleet("workloads", "explain", "second", "-n", s.namespace)
    assert "is Pending, waiting: PoolFull" in explained
    assert f"1st in team {nlp}'s queue" in explained
    assert "is Running in pool" in gpufleet("workloads", "explain", "first", "-n", s.namespace)
    # the filters and the counts
    running = json.loads(gpufleet("workloads", "list", "-A", "--team", nlp, "--state",
                                  "Running", "-o", "json"))  # fmt: skip
    assert [w["name"] for w in running] == ["first"]
    assert json.loads(gpufleet("workloads", "list", "-n", s.namespace, "--search", "SEC",
                               "-o", "json"))[0]["name"] == "second"  # fmt: skip
    stats = json.loads(gpufleet("workloads", "stats", "-n", s.namespace, "-o", "json"))
    assert {c["key"]: c["workloads"] for c in stats["byState"]} == {"Pending": 1, "Running": 1}
    assert stats["waitingGPUs"] == 8
    # teams, reservations, health and the identity the cluster sees
    team = next(t for t in json.loads(gpufleet("teams", "-o", "json")) if t["name"] == nlp)
    assert (team["reservedGPUs"], team["usedGPUs"], team["running"], team["waiting"]) == (
        8, 8, 1, 1,
    )  # fmt: skip
    (reservation,) = [
        r for r in json.loads(gpufleet("reservations", "-o", "json")) if r["team"] == nlp
    ]
    assert (reservation["pool"], reservation["gpus"]) == (s.pool, 8)
    health = json.loads(gpufleet("health", "-o", "json"))
    assert health["nodes"] >= 1 and health["gpus"] >= 8
    me = json.loads(gpufleet("whoami", "-o", "json"))
    assert me["user"] == "admin" and "system:masters" in me["groups"]
    gpufleet("workloads", "cancel", "first", "-n", s.namespace)
    # the GPUs are free again: the waiting workload is admitted
    s.wait_states({"second": "Running"})


def test_workloads_list_says_where_it_looked_when_nothing_matches(
    cluster: ControlPlane, controller: ControllerProcess, namespace: str
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "workloads",
            "list",
            "-n",
            namespace,
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    message = " ".join(result.stderr.split())
    assert f"No GPU workloads found in {namespace} namespace; use -A" in message


def test_healthz_reports_a_live_loop(controller: ControllerProcess) -> None:
    """The liveness probe's endpoint, on the metrics port: 200 while the loop completes cycles."""
    url = f"http://127.0.0.1:{controller.metrics_port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        assert response.read().decode().strip() == "ok"
    with urllib.request.urlopen(f"http://127.0.0.1:{controller.metrics_port}/metrics") as r:
        assert b"gpufleet_cycle_seconds" in r.read()


def test_dev_webhooks_leave_system_namespaces_alone(cluster: ControlPlane, scenario: Any) -> None:
    """`gpufleet controller run` registers its webhooks with a 10 s timeout and without
    kube-system: a team's GPU Job there is neither held nor managed."""
    config = cluster.get("mutatingwebhookconfiguration", "gpufleet.io")
    for hook in config["webhooks"]:  # the workloads', and the gated kinds' pods'
        assert hook["timeoutSeconds"] <= 10
        (expression,) = hook["namespaceSelector"]["matchExpressions"]
        assert expression["operator"] == "NotIn" and "kube-system" in expression["values"]
    s = scenario(1)
    team = s.team("ops")
    s.apply()
    own, s.namespace = s.namespace, "kube-system"
    try:
        assert s.job("system-job", team, "elastic", 1).returncode == 0
        job = cluster.get("job", "system-job", "-n", "kube-system")
        assert not job["spec"].get("suspend")
        assert not job["spec"]["template"]["spec"].get("schedulingGates")
        assert "gpufleet.io/managed" not in (job["metadata"].get("annotations") or {})
    finally:
        s.namespace = own  # the scenario's cleanup deletes its own namespace, not this one
        cluster.kubectl("delete", "job", "system-job", "-n", "kube-system", check=False)


def test_the_webhook_server_with_given_certificates_is_called_by_the_api_server(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The chart's way of serving (a mounted tls.crt/tls.key, all interfaces): the real API
    server calls the webhook over TLS and applies its JSON patch; the Job keeps what its
    author wrote. Its own configuration only matches kube-system Jobs with a test label, where
    the session's dev controller never looks."""

    from gpufleet.controllers import admission, webhooks
    from gpufleet.model.fleet import fleet_from_objects
    from gpufleet.pki import create_ca, issue_serving_cert
    from gpufleet.testing.cluster import free_port

    loaded = fleet_from_objects(
        gitops(
            {},
            {"given-cert": {"namespaces": ["kube-system"]}},
            policy={"admission": {"excludedNamespaces": []}},
        )
    )
    assert loaded.problems == []

    class Fleet:
        fleet_version = 1

        def load_fleet(self) -> Any:
            return loaded.fleet

    pki = create_ca(tmp_path / "ca")
    certs = tmp_path / "mounted"
    certs.mkdir()
    issue_serving_cert(pki.ca_cert, pki.ca_key, certs / "tls.crt", certs / "tls.key", ["127.0.0.1"])
    port = free_port()
    server = admission.AdmissionServer("0.0.0.0", port, certs / "tls.crt", certs / "tls.key")
    admission.Admission.source = Fleet()
    config = webhooks.configuration("127.0.0.1", port, pki.ca_cert, [])
    config["metadata"]["name"] = "gpufleet-given-cert-test"
    hook = config["webhooks"][0]  # the workloads' (not the pods')
    config["webhooks"] = [hook]
    hook["name"] = "given-cert.gpufleet.io"
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
    hook["objectSelector"] = {"matchLabels": {"gpufleet-test": "given-cert"}}
    # Jobs too: in kube-system, which the holding policy leaves alone, the webhook does it all
    hook["rules"] = [*hook["rules"], *check_rules()]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "given-cert-job",
            "namespace": "kube-system",
            "labels": {"gpufleet.io/team": "given-cert", "gpufleet-test": "given-cert"},
            "annotations": {"owner": "ada"},
        },
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
        },
    }
    server.start()
    try:
        cluster.apply([config])

        # the API server may take a moment to pick a new webhook configuration up: a Job it
        # created before that is not held, and is made again
        def created_held() -> bool:
            if cluster.apply([job], check=False).returncode != 0:
                return False
            made = cluster.get("job", "given-cert-job", "-n", "kube-system")
            if made["spec"]["template"]["spec"].get("schedulingGates"):
                return True
            cluster.kubectl("delete", "job", "given-cert-job", "-n", "kube-system", "--wait")
            return False

        cluster.wait_until(created_held, 30, "a Job held at its pods by the webhook")
        created = cluster.get("job", "given-cert-job", "-n", "kube-system")
        assert not created["spec"].get("suspend")
        assert created["spec"]["template"]["spec"]["schedulingGates"] == [
            {"name": "gpufleet.io/admission"}
        ]
        admin = cluster.kubectl(
            "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"
        ).stdout
        assert created["metadata"]["annotations"] == {
            "owner": "ada",
            "gpufleet.io/managed": "true",
            "gpufleet.io/submitter": admin,  # who the API server said created it
        }
        assert created["metadata"]["labels"]["gpufleet.io/class"] == "elastic"
        template = created["spec"]["template"]
        assert template["metadata"]["labels"]["app"] == "train"
        assert template["spec"]["priorityClassName"] == "gpufleet-elastic-normal"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in template[
            "spec"
        ]["tolerations"]
    finally:
        cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", "gpufleet-given-cert-test", check=False
        )
        cluster.kubectl("delete", "job", "given-cert-job", "-n", "kube-system", check=False)
        server.stop()
        admission.Admission.source = None

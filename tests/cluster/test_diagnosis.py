"""Diagnosis on the real control plane: Jobs whose pods fail with a chosen exit code and reason
(kwok's gpufleet-job-pod-failed stage) and log lines (fixture files, read through the same
LogReader interface as the API server's logs) are diagnosed by the controller; the result is
on the GPUWorkload, in an Event, and `gpufleet workloads diagnose` shows it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.testing.cluster import ControlPlane

from .conftest import REPO, ControllerProcess, job_manifest

CASES = {
    # job: (exit code, reason, log lines, expected pattern)
    "oom": (1, "Error", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
            "cuda-out-of-memory"),
    "killed": (137, "OOMKilled", [], "host-out-of-memory"),
    "hang": (1, "Error", ["[Rank 1] Watchdog caught collective operation timeout: "
                          "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600035 milliseconds"],
             "nccl-timeout"),
    "mystery": (3, "Error", ["step 10 done"], "unknown"),
}  # fmt: skip


def failing_job(namespace: str, name: str, team: str, code: int, reason: str) -> dict[str, Any]:
    labels = {"gpufleet.io/team": team, "gpufleet.io/class": "elastic"}
    body = job_manifest(name, namespace, labels, 1, 1, "2s")
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    annotations.update({"gpufleet.io/exit-code": str(code), "gpufleet.io/exit-reason": reason})
    return body


def test_failed_work_is_diagnosed(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    s = scenario(1)
    team = s.team("ml")
    s.apply()
    for name, (code, reason, lines, _) in CASES.items():
        folder = controller.logs / s.namespace
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.log").write_text("".join(f"{line}\n" for line in lines))
        body = failing_job(s.namespace, name, team, code, reason)
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    def diagnosed() -> bool:
        items = cluster.get("gwl", "-n", s.namespace)["items"]
        return len(items) == len(CASES) and all(
            (w.get("status") or {}).get("diagnosis") for w in items
        )

    cluster.wait_until(diagnosed, 90, "every failed Job diagnosed")
    found = {
        w["metadata"]["name"]: w["status"] for w in cluster.get("gwl", "-n", s.namespace)["items"]
    }
    for name, (code, reason, lines, pattern) in CASES.items():
        status = found[name]
        assert status["state"] == "Failed", name
        diagnosis = status["diagnosis"]
        assert diagnosis["pattern"] == pattern, (name, diagnosis)
        assert code in diagnosis["evidence"]["exitCodes"]
        assert reason in diagnosis["evidence"]["reasons"]
        assert diagnosis["evidence"].get("lastLogLines", []) == lines[-5:]
    assert found["killed"]["diagnosis"]["owner"] == "code"
    assert found["mystery"]["diagnosis"].get("owner") is None  # a merge patch drops nulls
    assert "cuda-out-of-memory" in s.events("oom")

    def told() -> bool:
        return all("Diagnosed" in s.events(name) for name in CASES)

    cluster.wait_until(told, 30, "a Diagnosed Event on every Job")
    controller.wait_cycles(6)  # a second diagnosis would have come by now
    for name in CASES:
        assert s.events(name).count("Diagnosed") == 1, s.events(name)  # diagnosed once

    runner = CliRunner()
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    shown = runner.invoke(app, ["workloads", "diagnose", "hang", "-n", s.namespace], env=env)
    assert shown.exit_code == 0, shown.output
    assert "nccl-timeout (likely owner: code)" in shown.output
    fresh = runner.invoke(
        app,
        ["workloads", "diagnose", "oom", "-n", s.namespace, "--fresh",
         "--log-fixtures", str(controller.logs), "-o", "json"],
        env=env,
    )  # fmt: skip
    assert fresh.exit_code == 0, fresh.output
    assert json.loads(fresh.stdout)["pattern"] == "cuda-out-of-memory"


def test_remediation_under_the_policy_with_approval_and_audit(
    cluster: ControlPlane, scenario: Any, tmp_path: Any
) -> None:
    s = scenario(1)
    team = s.team("ml")
    s.apply()
    for name, code, reason in (("sigkill", 137, "Error"), ("bug", 139, "Error")):
        body = failing_job(s.namespace, name, team, code, reason)
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    def diagnosed() -> bool:
        items = cluster.get("gwl", "-n", s.namespace)["items"]
        return len(items) == 2 and all((w.get("status") or {}).get("diagnosis") for w in items)

    cluster.wait_until(diagnosed, 90, "both failed Jobs diagnosed")
    runner = CliRunner()
    common = ["-n", s.namespace, "--policy", str(REPO / "policies" / "remediation.yaml"),
              "--ledger", str(tmp_path / "audit.db")]  # fmt: skip
    env = {"KUBECONFIG": str(cluster.kubeconfig)}

    def ops(*args: str) -> Any:
        return runner.invoke(app, ["ops", *args], env=env)

    # a segfault is the code's: the default policy does not resubmit it
    refused = ops("propose", "bug", "requeue", *common, "--as", "bob")
    assert refused.exit_code == 1 and "refused: no rule" in refused.output
    # a kill by signal may be resubmitted (tier 1: at once) ...
    requeued = ops("propose", "sigkill", "requeue", *common, "--as", "bob")
    assert requeued.exit_code == 0, requeued.output
    assert cluster.kubectl("get", "job", "sigkill-retry-1", "-n", s.namespace).returncode == 0
    # ... and its node cordoned, but only with an approval (tier 2)
    waiting = ops("propose", "sigkill", "cordon-node", *common, "--as", "bob")
    assert waiting.exit_code == 0 and "waits for an approval" in waiting.output
    proposal = waiting.output.split("proposal ")[1].split(":")[0]
    node = s.nodes[0]
    assert not cluster.get("node", node)["spec"].get("unschedulable")
    approved = ops("approve", proposal, *[a for a in common if a not in ("-n", s.namespace)],
                   "--as", "alice")  # fmt: skip
    assert approved.exit_code == 0, approved.output
    cordoned = cluster.get("node", node)
    assert cordoned["spec"]["unschedulable"] is True
    assert cordoned["metadata"]["annotations"]["gpufleet.io/cordoned-by"] == "alice"
    again = ops("approve", proposal, "--ledger", str(tmp_path / "audit.db"))
    assert again.exit_code == 1 and "decided already" in again.output
    log = ops("log", "--ledger", str(tmp_path / "audit.db"), "-o", "json")
    entries = [(r["entry"], r["actor"], r["action"]) for r in json.loads(log.stdout)]
    assert entries == [
        ("refused", "bob", "requeue"),
        ("proposed", "bob", "requeue"),
        ("executed", "bob", "requeue"),
        ("proposed", "bob", "cordon-node"),
        ("approved", "alice", "cordon-node"),
        ("executed", "alice", "cordon-node"),
    ]


def test_a_refused_log_read_is_said_once_not_hidden(
    cluster: ControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An identity without get pods/log (a chart before it granted it, a cluster's own RBAC):
    the API server refuses, diagnosis goes on without lines and says why, once."""
    from kubernetes import client

    from gpufleet.diagnose.collect import KubernetesLogs

    cluster.kubectl("create", "serviceaccount", "no-logs", "-n", namespace)
    token = cluster.kubectl("create", "token", "no-logs", "-n", namespace).stdout.strip()
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.pki.ca_cert)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    logs = KubernetesLogs(client.CoreV1Api(client.ApiClient(configuration)))
    caplog.set_level(logging.WARNING, logger="gpufleet.diagnosis")
    for pod in ("worker-0", "worker-1"):
        assert logs.tail(namespace, pod, "main", "job", 10) == []
    said = [r.getMessage() for r in caplog.records if "cannot read pod logs" in r.getMessage()]
    assert len(said) == 1 and "403" in said[0] and "pods/log" in said[0], said


def test_a_refused_events_read_still_gives_a_diagnosis(
    cluster: ControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An identity that may list pods but not Events (the chart before it granted list
    events, which no diagnosis under it survived): the evidence comes without Events, and
    says why, instead of the diagnosis failing every 30 s for ever."""
    from kubernetes import client

    from gpufleet.diagnose.collect import FixtureLogs, collect

    cluster.kubectl("create", "serviceaccount", "no-events", "-n", namespace)
    cluster.kubectl(
        "create", "role", "pods-only", "--verb=list", "--resource=pods", "-n", namespace
    )
    cluster.kubectl(
        "create", "rolebinding", "pods-only", "--role=pods-only",
        f"--serviceaccount={namespace}:no-events", "-n", namespace,
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "no-events", "-n", namespace).stdout.strip()
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.pki.ca_cert)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    core = client.CoreV1Api(client.ApiClient(configuration))
    failed = {"type": "Failed", "reason": "BackoffLimitExceeded"}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gone"},
           "status": {"conditions": [failed]}}  # fmt: skip
    caplog.set_level(logging.WARNING, logger="gpufleet.diagnosis")

    def pods_listed() -> bool:  # the binding is read by the API server a moment later
        try:
            core.list_namespaced_pod(namespace)
        except client.ApiException:
            return False
        return True

    cluster.wait_until(pods_listed, 30, "the pods-only binding to take effect")
    evidence = collect(core, namespace, job, FixtureLogs(cluster.work_dir / "no-such-logs"))
    assert evidence.reasons == ("BackoffLimitExceeded",) and evidence.events == ()
    said = [r.getMessage() for r in caplog.records if "cannot list Events" in r.getMessage()]
    assert len(said) == 1 and "403" in said[0] and "list on events" in said[0], said

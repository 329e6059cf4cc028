"""Diagnosis on the real control plane: Jobs whose pods fail with a chosen exit code and reason
(kwok's gpufleet-job-pod-failed stage) and log lines (fixture files, read through the same
LogReader interface as the API server's logs) are diagnosed by the controller; the result is
on the GPUWorkload, in an Event, and `gpufleet workloads diagnose` shows it."""

from __future__ import annotations

import json
from typing import Any

import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess, job_manifest

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
    assert "Diagnosed" in s.events("oom") and "cuda-out-of-memory" in s.events("oom")

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

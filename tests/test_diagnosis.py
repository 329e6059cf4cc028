"""The diagnosis pattern bank: each pattern recognises its failure fixture, priorities decide
between patterns that both match, and bad pattern files are located errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from conftest import REPO
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.diagnose.match import UNKNOWN, Evidence, diagnose, load_patterns
from gpufleet.model.states import WorkloadState

FIXTURES = yaml.safe_load((Path(__file__).parent / "data" / "diagnosis_fixtures.yaml").read_text())
PATTERNS = load_patterns()


def evidence(case: dict[str, Any]) -> Evidence:
    return Evidence(
        exit_codes=tuple(case.get("exitCodes", ())),
        reasons=tuple(case.get("reasons", ())),
        events=tuple(case.get("events", ())),
        logs=tuple(case.get("logs", ())),
        xids=tuple(case.get("xids", ())),
        gpu_unhealthy=case.get("gpuUnhealthy", False),
    )


def test_the_bank_has_a_fixture_for_every_pattern() -> None:
    assert len(PATTERNS) >= 15
    assert {p.name for p in PATTERNS} == {c["expect"] for c in FIXTURES} - {UNKNOWN}


@pytest.mark.parametrize("case", FIXTURES, ids=[c["expect"] for c in FIXTURES])
def test_each_failure_gets_its_diagnosis(case: dict[str, Any]) -> None:
    found = diagnose(PATTERNS, evidence(case))
    assert found.pattern == case["expect"], found.matched
    if found.pattern == UNKNOWN:
        assert found.owner is None and "evidence" in found.diagnosis
        assert found.status()["evidence"]["exitCodes"] == [3]
    else:
        assert found.matched and found.owner in ("code", "node", "cluster", "capacity")


def test_the_more_specific_pattern_wins() -> None:
    # exit 137 alone is a kill; with OOMKilled it is the memory limit (higher priority)
    assert diagnose(PATTERNS, Evidence(exit_codes=(137,))).pattern == "killed-by-signal"
    both = Evidence(exit_codes=(137,), reasons=("OOMKilled",))
    assert diagnose(PATTERNS, both).pattern == "host-out-of-memory"
    # an Xid 79 on an unhealthy node is the Xid, not merely "unhealthy"
    xid = Evidence(xids=(79,), gpu_unhealthy=True)
    assert diagnose(PATTERNS, xid).pattern == "gpu-fell-off-the-bus"


def test_site_patterns_extend_and_replace_the_bundled_ones(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpufleet.io/v1alpha1",
                "kind": "DiagnosisPattern",
                "metadata": {"name": "lustre-stale-handle"},
                "spec": {
                    "diagnosis": "The shared file system lost the file handle.",
                    "owner": "cluster",
                    "signals": {"logs": ["Stale file handle"]},
                },
            }
        )
    )
    bank = load_patterns([tmp_path])
    assert len(bank) == len(PATTERNS) + 1
    found = diagnose(bank, Evidence(logs=("OSError: [Errno 116] Stale file handle",)))
    assert found.pattern == "lustre-stale-handle"


def test_bad_patterns_are_located_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: gpufleet.io/v1alpha1\n"
        "kind: DiagnosisPattern\n"
        "metadata: {name: broken}\n"
        "spec:\n"
        "  diagnosis: x\n"
        "  owner: code\n"
        "  signals:\n"
        "    logs: ['CUDA (out of memory']\n"
        "    exitcodes: [1]\n"
    )
    done = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert "bad.yaml:8" in done.output and "not a valid regular expression" in done.output
    assert "bad.yaml:9" in done.output and "exitcodes" in done.output


def test_the_repositorys_policies_validate() -> None:
    done = CliRunner().invoke(app, ["validate", str(REPO / "policies")])
    assert done.exit_code == 0, done.output


def test_remediation_is_denied_by_default_and_tiered() -> None:
    from gpufleet.model.api import RemediationPolicy
    from gpufleet.remediate.policy import judge

    assert not judge([], "requeue", "node-went-away", "nlp").allowed  # no policy: nothing
    policy = RemediationPolicy.model_validate(
        {
            "metadata": {"name": "p"},
            "spec": {
                "rules": [
                    {"action": "requeue", "patterns": ["node-went-away"], "teams": ["nlp"]},
                    {"action": "cordon-node", "patterns": ["gpu-fell-off-the-bus"]},
                    {
                        "action": "cordon-node",
                        "patterns": ["gpu-uncorrectable-ecc"],
                        "preApproved": True,
                    },
                ]
            },
        }
    )
    requeue = judge([policy], "requeue", "node-went-away", "nlp")
    assert requeue.allowed and requeue.tier == 1 and not requeue.needs_approval
    assert not judge([policy], "requeue", "node-went-away", "cv").allowed  # another team
    assert not judge([policy], "requeue", "cuda-out-of-memory", "nlp").allowed
    cordon = judge([policy], "cordon-node", "gpu-fell-off-the-bus", "cv")
    assert cordon.allowed and cordon.tier == 2 and cordon.needs_approval
    assert not judge([policy], "cordon-node", "gpu-uncorrectable-ecc", "cv").needs_approval
    unknown = judge([policy], "reboot", "gpu-fell-off-the-bus", "cv")
    assert not unknown.allowed and "unknown action" in unknown.reason


def test_a_failed_workload_is_queued_for_diagnosis_once() -> None:
    """The watch may bring the diagnosis to the cache a moment after it was written: the
    workload is not diagnosed again meanwhile, but a new Job of the same name is."""
    import threading

    from gpufleet.controllers import diagnosis
    from gpufleet.kube import observe

    def failed(uid: str) -> Any:
        job = {"metadata": {"namespace": "ml", "name": "train", "uid": uid}}
        workload = {"metadata": {"namespace": "ml", "name": "train"}, "status": {"state": "Failed"}}
        return observe.Observed(job, workload, WorkloadState.FAILED, ())

    # no call reaches the API, the writer or the logs: submit only queues
    diagnoser = diagnosis.Diagnoser(*(cast(Any, None),) * 3, [], cast(Any, None), threading.Event())
    diagnoser.submit([failed("a")])
    assert diagnoser.work.qsize() == 1
    item = diagnoser.work.get()
    diagnoser.done.add((item.key, "a"))  # what run() records after a diagnosis
    diagnoser.pending.clear()
    diagnoser.submit([failed("a")])  # the cache still shows no diagnosis
    assert diagnoser.work.qsize() == 0
    diagnoser.submit([failed("b")])  # deleted and created again: a new failure
    assert diagnoser.work.qsize() == 1

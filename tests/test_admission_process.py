"""The webhook in a process of its own (`controllers/admission_process.py`): a real process
answering AdmissionReviews over HTTPS, sent the fleet by its controller, started again when it
dies, gone when its controller stops it or goes away."""

from __future__ import annotations

import json
import os
import signal
import ssl
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import gitops

from gpufleet.controllers import admission_process
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.pki import create_ca, issue_serving_cert
from gpufleet.testing.cluster import free_port


class Source:
    """The controller's fleet, as `load_fleet` gives it; `publish` changes it."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.fleet_version = fleet, 1
        self.changed = threading.Event()

    def load_fleet(self) -> Fleet:
        return self.fleet

    def publish(self, fleet: Fleet) -> None:
        self.fleet, self.fleet_version = fleet, self.fleet_version + 1
        self.changed.set()


def fleet_of(*teams: str) -> Fleet:
    loaded = fleet_from_objects(gitops({"h100": {}}, {t: {"namespaces": [t]} for t in teams}))
    assert loaded.problems == []
    return loaded.fleet


def review(port: int, ca: Path, team: str) -> dict[str, Any]:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": team, "labels": {"gpufleet.io/team": team}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
                }
            }
        },
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"kind": "Job"}, "operation": "CREATE", "object": job},
    }
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/admit-jobs",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        response: dict[str, Any] = json.load(answer)["response"]
    return response


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path, Path]:
    pki = create_ca(tmp_path / "ca")
    cert, key = tmp_path / "webhook.crt", tmp_path / "webhook.key"
    issue_serving_cert(pki.ca_cert, pki.ca_key, cert, key, ["127.0.0.1"])
    return pki.ca_cert, cert, key


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_webhook_process_answers_from_the_fleet_it_is_sent(
    certs: tuple[Path, Path, Path],
) -> None:
    ca, cert, key = certs
    source = Source(fleet_of("nlp"))
    port = free_port()
    process = admission_process.AdmissionProcess(
        "127.0.0.1", port, cert, key, source, source.changed, "kai-scheduler"
    )
    process.start()
    try:
        answer = review(port, ca, "nlp")
        assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
        refused = review(port, ca, "vision")  # a team the fleet does not know
        assert refused["allowed"] is False
        assert "vision" in refused["status"]["message"]

        # a Team that arrives is sent on, and a create waiting on it is answered
        source.publish(fleet_of("nlp", "vision"))
        assert review(port, ca, "vision")["allowed"] is True

        # a webhook process that dies is started again, and is sent the fleet again
        first = process.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: process.pid != first, 10, "the webhook process started again")

        def answers() -> bool:
            try:
                return review(port, ca, "vision")["allowed"] is True
            except OSError:
                return False

        wait_until(answers, 15, "the restarted webhook answering from the fleet")
    finally:
        process.stop()
    assert process.process is not None and process.process.poll() is not None


def test_the_webhook_process_exits_when_its_input_ends(certs: tuple[Path, Path, Path]) -> None:
    """A controller killed outright leaves no webhook that answers from a stale fleet: the
    process sees its stdin close."""
    ca, cert, key = certs
    source = Source(fleet_of("nlp"))
    port = free_port()
    process = admission_process.AdmissionProcess(
        "127.0.0.1", port, cert, key, source, source.changed
    )
    process.start()
    try:
        assert review(port, ca, "nlp")["allowed"] is True
        child = process.process
        assert child is not None and child.stdin is not None
        process.stopping.set()  # no restart: this stands for a controller that is gone
        child.stdin.close()
        assert child.wait(10) == 0
    finally:
        process.stop()


def test_a_webhook_process_that_cannot_listen_is_an_error(
    certs: tuple[Path, Path, Path],
) -> None:
    _, cert, key = certs
    source = Source(fleet_of("nlp"))
    port = free_port()
    first = admission_process.AdmissionProcess("127.0.0.1", port, cert, key, source, source.changed)
    first.start()
    try:
        second = admission_process.AdmissionProcess(
            "127.0.0.1", port, cert, key, source, threading.Event()
        )
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
            second.start(timeout=15)
    finally:
        first.stop()

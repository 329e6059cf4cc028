"""The agent's token reaches only its own node: the chart's policy
(`templates/agent-policy.yaml`) on the real API server, with a token bound to a pod on one
node, as the agent's DaemonSet pod gets it."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpufleet.testing.cluster import ControlPlane

from .test_chart import CHART, helm

CONDITION = "GPUHealthy"


class AgentIdentity:
    """The chart's agent RBAC and policy under a release of its own, and a pod of the agent's
    service account on the first of two nodes."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.release = f"ap{uuid.uuid4().hex[:6]}"
        self.namespace = f"{self.release}-system"
        self.nodes = cluster.add_gpu_nodes(2, 8, "H100", prefix=f"{self.release}-node")
        out = helm(
            "template", self.release, str(CHART), "-n", self.namespace,
            "--show-only", "templates/agent-policy.yaml",
            "--show-only", "templates/rbac.yaml",
            "--show-only", "templates/serviceaccounts.yaml",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        self.manifest = out.stdout
        cluster.kubectl("create", "namespace", self.namespace)
        cluster.kubectl("apply", "-f", "-", input=self.manifest)
        self.account = f"{self.release}-agent"
        cluster.apply(
            [
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "agent", "namespace": self.namespace},
                 "spec": {"serviceAccountName": self.account, "nodeName": self.nodes[0],
                          "tolerations": [{"operator": "Exists"}],
                          "containers": [{"name": "agent", "image": "gpufleet"}]}},
            ]
        )  # fmt: skip

    def token(self, bound_to_pod: bool = True) -> str:
        bound = ["--bound-object-kind=Pod", "--bound-object-name=agent"] if bound_to_pod else []
        made = self.cluster.kubectl("create", "token", self.account, "-n", self.namespace, *bound)
        return made.stdout.strip()

    def patch_condition(self, token: str, node: str, kind: str = CONDITION) -> httpx.Response:
        """What the agent sends: a strategic merge patch of one node condition."""
        condition = {"type": kind, "status": "False", "reason": "XidError",
                     "message": "set by the test", "lastHeartbeatTime": None}  # fmt: skip
        context = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        return httpx.patch(
            f"{self.cluster.server}/api/v1/nodes/{node}/status",
            content=json.dumps({"status": {"conditions": [condition]}}),
            headers={"Authorization": f"Bearer {token}",
                     "Content-Type": "application/strategic-merge-patch+json"},
            verify=context,
            timeout=30,
        )  # fmt: skip

    def create_event(self, token: str, node: str, namespace: str = "default") -> httpx.Response:
        """What the agent sends for a finding: a core Event about a node."""
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{node}.", "namespace": namespace},
                 "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
                 "reason": "XidError", "message": "set by the test", "type": "Warning",
                 "source": {"component": "gpufleet-agent", "host": node}}  # fmt: skip
        context = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        return httpx.post(
            f"{self.cluster.server}/api/v1/namespaces/{namespace}/events",
            json=event,
            headers={"Authorization": f"Bearer {token}"},
            verify=context,
            timeout=30,
        )

    def conditions(self, node: str) -> dict[str, Any]:
        found = self.cluster.get("node", node)["status"].get("conditions") or []
        return {c["type"]: c for c in found}

    def delete(self) -> None:
        self.cluster.kubectl("delete", "-f", "-", "--wait=false", input=self.manifest, check=False)
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        for node in self.nodes:
            self.cluster.kubectl("delete", "node", node, "--wait=false", check=False)


@pytest.fixture(scope="module")
def agent(cluster: ControlPlane) -> Iterator[AgentIdentity]:
    made = AgentIdentity(cluster)
    # the API server loads a new policy a moment after it is created: until it refuses a
    # token that names no node, a write the policy is meant to stop could still go through
    unbound = made.token(bound_to_pod=False)
    cluster.wait_until(
        lambda: "names no node" in made.patch_condition(unbound, made.nodes[0]).text,
        60,
        "the API server to enforce the agent's policy",
    )
    yield made
    made.delete()


def test_the_agent_marks_its_own_node(agent: AgentIdentity) -> None:
    token = agent.token()

    def allowed() -> bool:  # the policy and the RBAC are read by the server within seconds
        return agent.patch_condition(token, agent.nodes[0]).status_code == 200

    agent.cluster.wait_until(allowed, 30, "the agent's own node to take its condition")
    assert agent.conditions(agent.nodes[0])[CONDITION]["status"] == "False"


def test_the_agent_cannot_mark_another_node(agent: AgentIdentity) -> None:
    token = agent.token()
    other = agent.nodes[1]

    def refused() -> httpx.Response | None:
        answer = agent.patch_condition(token, other)
        return answer if answer.status_code == 403 and "may change only" in answer.text else None

    agent.cluster.wait_until(lambda: refused() is not None, 30, "the policy to refuse")
    answer = refused()
    assert answer is not None
    assert f"the gpufleet agent on node {agent.nodes[0]} may change only that node" in answer.text
    assert CONDITION not in agent.conditions(other)


def test_the_agent_cannot_change_another_condition_of_its_node(agent: AgentIdentity) -> None:
    answer = agent.patch_condition(agent.token(), agent.nodes[0], kind="Ready")
    assert answer.status_code == 403, answer.text
    assert "only the GPUHealthy condition" in answer.text


def test_a_token_not_bound_to_the_agents_pod_changes_no_node(agent: AgentIdentity) -> None:
    answer = agent.patch_condition(agent.token(bound_to_pod=False), agent.nodes[0])
    assert answer.status_code == 403, answer.text
    assert "names no node" in answer.text


def test_the_agent_records_events_only_about_its_own_node(agent: AgentIdentity) -> None:
    token = agent.token()
    agent.cluster.wait_until(
        lambda: agent.create_event(token, agent.nodes[0]).status_code == 201,
        30,
        "an Event about the agent's own node to be taken",
    )
    other = agent.create_event(token, agent.nodes[1])
    assert other.status_code == 403, other.text
    assert f"the gpufleet agent on node {agent.nodes[0]} may record Events only" in other.text
    elsewhere = agent.create_event(token, agent.nodes[0], namespace=agent.namespace)
    assert elsewhere.status_code == 403, elsewhere.text  # RBAC: the default namespace only
    unbound = agent.create_event(agent.token(bound_to_pod=False), agent.nodes[0])
    assert unbound.status_code == 403, unbound.text
    assert "names no node" in unbound.text
    mine = agent.cluster.kubectl(
        "get", "events", "-n", "default", "-o", "json",
        "--field-selector", "source=gpufleet-agent",
    )  # fmt: skip
    about = {e["involvedObject"]["name"] for e in json.loads(mine.stdout)["items"]}
    assert agent.nodes[0] in about and agent.nodes[1] not in about

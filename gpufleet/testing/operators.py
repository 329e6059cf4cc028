"""The operators of the workload kinds gpufleet admits, run beside the local control plane:
JobSet, Kubeflow Trainer, KubeRay, LeaderWorkerSet and the Kubeflow Training Operator
(PyTorchJob), built from their Go modules by hack/k8s/build.sh.

Each runs as a process on the host with this control plane's kubeconfig, no leader election and
no metrics; an operator with admission webhooks serves them with a certificate from the control
plane's CA and has them registered by URL (as `gpufleet controller run` registers its own), so
its validation runs on every create and update, as in a cluster. `stop` removes the webhook
configurations before the processes go: a webhook nobody serves would refuse every create.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.pki import issue_serving_cert

from .cluster import ClusterError, ControlPlane, free_port


@dataclass(frozen=True)
class Hook:
    """One admission webhook of an operator."""

    mutating: bool
    path: str
    group: str
    version: str
    resources: tuple[str, ...]
    operations: tuple[str, ...] = ("CREATE", "UPDATE")
    # only the objects with this label (a pod webhook that must not see every pod)
    label: str | None = None


@dataclass(frozen=True)
class Operator:
    name: str  # its binary in bin_dir; its CRDs are in NAME-crds/
    hooks: tuple[Hook, ...] = ()
    needs: tuple[str, ...] = ()  # operators it needs running (Trainer runs its pods in JobSets)

    @property
    def crds(self) -> str:
        return f"{self.name}-crds"


JOBSET = Operator(
    "jobset",
    (
        Hook(True, "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2",
             ("jobsets",), ("CREATE",)),
        Hook(False, "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2",
             ("jobsets",)),
    ),
)  # fmt: skip
TRAINER = Operator(
    "trainer-controller-manager",
    (
        Hook(True, "/mutate-trainer-kubeflow-org-v1alpha1-trainjob", "trainer.kubeflow.org",
             "v1alpha1", ("trainjobs",)),
        Hook(False, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", "trainer.kubeflow.org",
             "v1alpha1", ("trainjobs",)),
        Hook(False, "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime",
             "trainer.kubeflow.org", "v1alpha1", ("clustertrainingruntimes",)),
    ),
    needs=("jobset",),
)  # fmt: skip
KUBERAY = Operator("kuberay-operator")  # its webhooks are off unless enabled
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS = Operator(
    "lws",
    (
        Hook(True, "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
             "leaderworkerset.x-k8s.io", "v1", ("leaderworkersets",)),
        Hook(False, "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
             "leaderworkerset.x-k8s.io", "v1", ("leaderworkersets",)),
        # its pods get their group and worker labels here
        Hook(True, "/mutate--v1-pod", "", "v1", ("pods",), ("CREATE",), LWS_NAME),
        Hook(False, "/validate--v1-pod", "", "v1", ("pods",), ("CREATE",), LWS_NAME),
    ),
)  # fmt: skip
TRAINING = Operator("training-operator")  # v1.7: PyTorchJob only, no webhooks
OPERATORS = {o.name: o for o in (JOBSET, TRAINER, KUBERAY, LWS, TRAINING)}


def missing_operators(bin_dir: Path) -> list[str]:
    return [
        name
        for name, op in OPERATORS.items()
        if not (bin_dir / name).is_file() or not (bin_dir / op.crds).is_dir()
    ]


@dataclass
class Operators:
    """Operators started on one control plane."""

    plane: ControlPlane
    started: list[str] = field(default_factory=list)
    webhooks: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) registered
    ports: dict[str, int] = field(default_factory=dict)  # each operator's webhook port

    def start(self, *names: str, timeout: float = 90) -> None:
        for name in names:
            op = OPERATORS[name]
            for needed in op.needs:
                if needed not in self.started:
                    self.start(needed, timeout=timeout)
            if name in self.started:
                continue
            self.plane.install_crds([self.plane.bin_dir / op.crds])
            self._run(op, timeout)
            self.started.append(name)
            if op.hooks:
                self._register(op)

    def stop(self) -> None:
        for kind, name in self.webhooks:
            self.plane.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self.webhooks.clear()
        for name in reversed(self.started):
            self.plane.stop_process(name)
        self.started.clear()

    def _run(self, op: Operator, timeout: float) -> None:
        folder = self.plane.work_dir / op.name
        folder.mkdir(parents=True, exist_ok=True)
        health, webhook = free_port(), free_port()
        certs = folder / "k8s-webhook-server" / "serving-certs"  # where controller-runtime looks
        certs.mkdir(parents=True, exist_ok=True)
        pki = self.plane.pki
        issue_serving_cert(
            pki.ca_cert, pki.ca_key, certs / "tls.crt", certs / "tls.key", ["127.0.0.1"]
        )
        env = {"TMPDIR": str(folder)}  # Trainer's webhook server reads $TMPDIR/k8s-webhook-...
        probe = f"127.0.0.1:{health}"
        args: list[str] = [op.name]
        if op is JOBSET or op is LWS:
            group = "jobset" if op is JOBSET else "lws"
            args += ["--config", str(_write(folder / "config.yaml", {
                "apiVersion": f"config.{group}.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
                "metrics": {"bindAddress": "0"},
                "health": {"healthProbeBindAddress": probe},
            }))]  # fmt: skip
        elif op is TRAINER:
            args += ["--config", str(_write(folder / "config.yaml", {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "webhook": {"port": webhook, "host": "127.0.0.1"},
                "metrics": {"bindAddress": "0"},
                "health": {"healthProbeBindAddress": probe, "readinessEndpointName": "readyz",
                           "livenessEndpointName": "healthz"},
            }))]  # fmt: skip
        elif op is TRAINING:
            args += ["--metrics-bind-address", "0", "--health-probe-bind-address", probe]
            args += ["--enable-scheme", "pytorchjob", "--monitoring-port", str(free_port())]
        else:
            args += ["--metrics-addr", "0", "--health-probe-bind-address", probe]
            args += ["--enable-leader-election=false"]
        self.plane.start_process(op.name, args, env, f"http://{probe}/readyz", timeout)
        self.ports[op.name] = webhook

    def _register(self, op: Operator) -> None:
        bundle = base64.b64encode(self.plane.pki.ca_cert.read_bytes()).decode()
        port = self.ports[op.name]
        for mutating in (True, False):
            hooks = [h for h in op.hooks if h.mutating is mutating]
            if not hooks:
                continue
            kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
            name = f"{op.name}-local"
            body: dict[str, Any] = {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": f"hook-{i}.{op.name}.local",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 10,
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}{h.path}",
                            "caBundle": bundle,
                        },
                        "rules": [
                            {
                                "apiGroups": [h.group],
                                "apiVersions": [h.version],
                                "resources": list(h.resources),
                                "operations": list(h.operations),
                            }
                        ],
                        **(
                            {
                                "objectSelector": {
                                    "matchExpressions": [{"key": h.label, "operator": "Exists"}]
                                }
                            }
                            if h.label
                            else {}
                        ),
                    }
                    for i, h in enumerate(hooks)
                ],
            }
            self.plane.apply([body])
            self.webhooks.append((kind.lower(), name))


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


__all__ = ["OPERATORS", "ClusterError", "Operators", "missing_operators"]

"""The webhook configurations of a controller run outside the chart (`gpufleet controller
run`): registered once its webhook server listens, removed on a clean exit.

They carry what a shared cluster needs: a namespaceSelector that leaves kube-system and the
controller's own namespace alone (a broken dev controller then cannot block the cluster's own
Jobs), and a 10 s timeout. The chart ships its own configuration
(charts/gpufleet/templates/webhook.yaml).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.chart import admission_rules, check_rules
from gpufleet.kube.holding import CHECK_ANNOTATION
from gpufleet.model.keys import ADMISSION_GATE, WORKLOAD_LABEL

from .admission import PATH

log = logging.getLogger("gpufleet.webhooks")

NAME = "gpufleet.io"  # one configuration of each kind, named like the API group
TIMEOUT_S = 10
# CEL: a pod not held yet: a gated kind's whose template the API server did not gate (a
# LeaderWorkerSet's; a Deployment's pods come gated from theirs and never reach the webhook)
NOT_GATED = (
    "!has(object.spec.schedulingGates) || "
    f"!object.spec.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}')"
)
# CEL: a workload the holding policy could not vouch for (the chart's webhook.yaml says the same)
TO_CHECK = (
    f"has(object.metadata.annotations) && '{CHECK_ANNOTATION}' in object.metadata.annotations"
)


def configuration(host: str, port: int, ca_cert: Path, skip: list[str]) -> dict[str, Any]:
    common = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": TIMEOUT_S,
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": sorted(set(skip)),
                }
            ]
        },
        "clientConfig": {
            "url": f"https://{host}:{port}{PATH}",
            "caBundle": base64.b64encode(ca_cert.read_bytes()).decode(),
        },
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "gpufleet"}},
        "webhooks": [
            {
                "name": f"admit-jobs.{NAME}",  # it refuses malformed workloads, marks the others
                **common,
                "rules": admission_rules(),
            },
            {
                # the Jobs, Deployments and bare pods the API server holds (holding.py) but could
                # not vouch for: a Team it does not know yet, labels it would refuse. Ignore:
                # when no controller answers they stay held, and the controller says why once
                # it is back
                "name": f"check-jobs.{NAME}",
                **common,
                "failurePolicy": "Ignore",
                "matchConditions": [{"name": "unvouched", "expression": TO_CHECK}],
                "rules": check_rules(),
            },
            {
                # a safety net for the pods of the gated kinds: one that carries the label and
                # no gate is held until admitted (the holding policies gate Deployments' and
                # LeaderWorkerSets' templates, and bare pods made again come gated)
                "name": f"admit-pods.{NAME}",
                **common,
                "objectSelector": {
                    "matchExpressions": [{"key": WORKLOAD_LABEL, "operator": "Exists"}]
                },
                "matchConditions": [{"name": "not-gated", "expression": NOT_GATED}],
                "rules": [POD_RULE],
            },
        ],
    }


# the pods of gated kinds (the chart's webhook.yaml says the same)
POD_RULE = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
    "operations": ["CREATE"],
    "scope": "Namespaced",
}


class WebhookRegistration:
    def __init__(
        self, api: client.AdmissionregistrationV1Api, host: str, port: int, ca_cert: Path
    ) -> None:
        self.api, self.host, self.port, self.ca_cert = api, host, port, ca_cert

    def register(self, skip: list[str]) -> None:
        api = self.api
        body = configuration(self.host, self.port, self.ca_cert, skip)
        try:
            api.create_mutating_webhook_configuration(body, _request_timeout=TIMEOUT_S)
        except ApiException as err:
            if err.status != 409:
                raise
            current = api.read_mutating_webhook_configuration(NAME, _request_timeout=TIMEOUT_S)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            api.replace_mutating_webhook_configuration(NAME, body, _request_timeout=TIMEOUT_S)
        # earlier versions validated in a second webhook whose path no longer exists: one
        # left behind by a crashed dev controller would refuse every Job
        self._delete(api.delete_validating_webhook_configuration, "Validating")
        log.info("webhook registered (%s:%d, skipping namespaces %s)", self.host, self.port, skip)

    def remove(self) -> None:
        self._delete(self.api.delete_mutating_webhook_configuration, "Mutating")

    def _delete(self, call: Any, kind: str) -> None:
        try:
            call(NAME, _request_timeout=TIMEOUT_S)
        except ApiException as err:
            if err.status != 404:
                log.warning("could not remove %sWebhookConfiguration %s", kind, NAME)

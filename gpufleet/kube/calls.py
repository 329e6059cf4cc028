"""The few Kubernetes API calls more than one shell makes (the controller, the API server, the
CLI): each with the timeout every call of gpufleet's has, so that no call holds a worker, a
request or a shutdown longer."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3 import HTTPHeaderDict

from gpufleet.model.api import SecretKeyRef
from gpufleet.notify.delivery import DeliveryError

from .kinds import WorkloadKind

API_TIMEOUT_S = 10  # no call may hold a worker, a request or a shutdown longer
SECRET_TTL_S = 60.0


def pod_log_lines(
    core: Any, pod: str, namespace: str, container: str, tail: int, timeout: float = API_TIMEOUT_S
) -> list[str]:
    """The last `tail` lines of a container's log, read through the API server from its node's
    kubelet. Read raw: the client's own decoding of this answer turns the body's bytes into
    their repr, one "b'...'" line holding every line break."""
    answer = core.read_namespaced_pod_log(
        pod, namespace, container=container, tail_lines=tail, _request_timeout=timeout,
        _preload_content=False,
    )  # fmt: skip
    return bytes(answer.data).decode(errors="replace").splitlines()


def delete_object(
    custom: Any, core: Any, kind: WorkloadKind, namespace: str, name: str, uid: str | None = None
) -> None:
    """Delete the object a workload stands for (a cancel): through the custom-object path,
    batch/v1 included, but a bare pod through the core API, which that path does not reach.
    With `uid`, only that object: one made again under the same name is left alone (409)."""
    # one body for both: the API server reads a DELETE's options from its body when it has
    # one and then ignores the query's (propagationPolicy would be lost: a Job's pods orphaned)
    options: dict[str, Any] = {"propagationPolicy": "Background"}
    if uid:
        options["preconditions"] = {"uid": uid}
    if kind.bare:
        core.delete_namespaced_pod(name, namespace, body=options, _request_timeout=API_TIMEOUT_S)
    else:
        custom.delete_namespaced_custom_object(
            kind.group,
            kind.version,
            namespace,
            kind.plural,
            name,
            body=options,
            _request_timeout=API_TIMEOUT_S,
        )


def create_as(
    api: client.ApiClient,
    kind: WorkloadKind,
    namespace: str,
    body: dict[str, Any],
    user: str | None,
    groups: tuple[str, ...] = (),
    uid: str = "",
    dry_run: bool = False,
) -> dict[str, Any]:
    """Create a workload's object as `user` (of `groups`): the API server's impersonation, so
    its RBAC, quotas and admission judge that user and its audit log names them; None: as this
    client. Each group is its own Impersonate-Group header, which the generated API methods
    cannot send (they take the headers as a dict); ApiException on a refusal."""
    headers = HTTPHeaderDict({"Accept": "application/json", "Content-Type": "application/json"})
    if user is not None:
        headers["Impersonate-User"] = user
        for group in groups:
            headers.add("Impersonate-Group", group)
        if uid:
            headers["Impersonate-Uid"] = uid
    api.update_params_for_auth(headers, [], ["BearerToken"])
    if kind.bare:
        path = f"/api/v1/namespaces/{namespace}/pods"
    else:
        path = f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}"
    query = {"dryRun": "All"} if dry_run else None
    response = api.rest_client.request(
        "POST",
        api.configuration.host + path,
        query_params=query,
        headers=headers,
        body=body,
        _request_timeout=API_TIMEOUT_S,
    )
    created: dict[str, Any] = json.loads(response.data)
    return created


def who_am_i(api: client.ApiClient) -> str:
    """The user name this client acts as, as the API server sees it (a SelfSubjectReview, which
    every authenticated user may make)."""
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        _request_timeout=API_TIMEOUT_S,
    )
    return str(review.status.user_info.username)


def api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "")["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return ""


class KubernetesSecrets:
    """Reads Secret keys, each cached for a minute (a rotated URL is picked up quickly)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.cache: dict[tuple[str, str, str], tuple[float, str]] = {}
        self.lock = threading.Lock()

    def __call__(self, ref: SecretKeyRef) -> str:
        key = (ref.namespace, ref.name, ref.key)
        with self.lock:
            hit = self.cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < SECRET_TTL_S:
            return hit[1]
        try:
            secret = self.core.read_namespaced_secret(
                ref.name, ref.namespace, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            what = "not found" if err.status == 404 else f"cannot be read ({err.reason})"
            raise DeliveryError(f"Secret {ref.namespace}/{ref.name} {what}") from err
        data = secret.data or {}
        if ref.key not in data:
            keys = ", ".join(sorted(data)) or "none"
            raise DeliveryError(
                f"Secret {ref.namespace}/{ref.name} has no key {ref.key!r} (it has: {keys})"
            )
        value = base64.b64decode(data[ref.key]).decode().strip()
        with self.lock:
            self.cache[key] = (time.monotonic(), value)
        return value

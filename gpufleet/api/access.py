"""Who is calling and what they may do, as Kubernetes decides it: a bearer token is checked with
a TokenReview, each request with a SubjectAccessReview on the gpufleet.io resource (or core
resource) and verb it touches. Answers are cached for a few seconds: a dashboard polling five
endpoints must not cost ten API calls a second per viewer; a flood of bad tokens must neither
cost a TokenReview each nor push the good callers out of the cache."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.model.api import GROUP

LOCAL_USER = "local"


@dataclass(frozen=True)
class Permission:
    verb: str
    resource: str
    group: str = GROUP
    namespace: str | None = None  # None: cluster-wide (or a cluster-scoped resource)
    name: str | None = None  # one object (RBAC's resourceNames), None: any

    def __str__(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.name:
            what += f" {self.name}"
        where = f" in namespace {self.namespace}" if self.namespace else " (cluster-wide)"
        return f"{self.verb} {what}{where}"

    def as_dict(self) -> dict[str, str | None]:
        asked = {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "namespace": self.namespace,
        }
        return {**asked, "name": self.name} if self.name else asked


@dataclass(frozen=True)
class Caller:
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


class Access(Protocol):
    insecure_local: bool

    def authenticate(self, token: str | None) -> Caller | None: ...

    def known(self, token: str | None) -> Caller | None:
        """The caller of `token` if already known (cached), asking nobody."""
        ...

    def allows(self, caller: Caller, permission: Permission) -> bool: ...


class LocalAccess:
    """`--insecure-local`: no token asked, everything allowed (a dev cluster on loopback)."""

    insecure_local = True

    def authenticate(self, token: str | None) -> Caller | None:
        return Caller(LOCAL_USER)

    def known(self, token: str | None) -> Caller | None:
        return Caller(LOCAL_USER)

    def allows(self, caller: Caller, permission: Permission) -> bool:
        return True


class _Expiring:
    """A map whose entries live `ttl` seconds and that holds at most `limit`: past it, the
    oldest entry goes (never all of them: a flood must not make every caller ask again)."""

    def __init__(self, ttl: float, clock: Callable[[], float], limit: int = 50_000) -> None:
        self.ttl, self.clock, self.limit = ttl, clock, limit
        self.entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> tuple[bool, Any]:
        with self.lock:
            found = self.entries.get(key)
            if found is None or found[0] < self.clock():
                return False, None
            return True, found[1]

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.entries.pop(key, None)
            self.entries[key] = (self.clock() + self.ttl, value)
            while len(self.entries) > self.limit:
                self.entries.popitem(last=False)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()  # never keep tokens themselves


class KubernetesAccess:
    """TokenReview and SubjectAccessReview through the API server (`authentication.k8s.io`,
    `authorization.k8s.io`); the server's own service account needs `create` on both."""

    insecure_local = False

    def __init__(
        self,
        authentication: Any,  # kubernetes.client.AuthenticationV1Api
        authorization: Any,  # kubernetes.client.AuthorizationV1Api
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.authentication = authentication
        self.authorization = authorization
        self.callers = _Expiring(ttl, clock)
        # rejected tokens apart, and fewer: random tokens neither evict the callers nor cost a
        # TokenReview each when sent again (and the server limits them per client)
        self.rejected = _Expiring(ttl, clock, limit=10_000)
        self.decisions = _Expiring(ttl, clock)

    def known(self, token: str | None) -> Caller | None:
        found, cached = self.callers.get(token_digest(token)) if token else (False, None)
        return cached if found and isinstance(cached, Caller) else None

    def authenticate(self, token: str | None) -> Caller | None:
        if not token:
            return None
        key = token_digest(token)
        known, cached = self.callers.get(key)
        if known:
            return cached if isinstance(cached, Caller) else None
        if self.rejected.get(key)[0]:
            return None
        review = self.authentication.create_token_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
             "spec": {"token": token}}
        )  # fmt: skip
        status = review.status
        caller: Caller | None = None
        if status is not None and status.authenticated and status.user is not None:
            user = status.user
            caller = Caller(
                user.username or "",
                tuple(user.groups or ()),
                user.uid or "",
                {k: list(v) for k, v in (user.extra or {}).items()},
            )
        if caller is None:
            self.rejected.put(key, True)
        else:
            self.callers.put(key, caller)
        return caller

    def allows(self, caller: Caller, permission: Permission) -> bool:
        key = (caller.user, caller.groups, caller.uid, permission)
        known, allowed = self.decisions.get(key)
        if known:
            return bool(allowed)
        attributes = {"verb": permission.verb, "group": permission.group,
                      "resource": permission.resource}  # fmt: skip
        if permission.namespace:
            attributes["namespace"] = permission.namespace
        if permission.name:
            attributes["name"] = permission.name
        review = self.authorization.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": caller.user,
                    "groups": list(caller.groups),
                    "uid": caller.uid or None,
                    "extra": caller.extra or None,
                    "resourceAttributes": attributes,
                },
            }
        )
        allowed = bool(review.status and review.status.allowed)
        self.decisions.put(key, allowed)
        return allowed

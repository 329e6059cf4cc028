"""Image references as Docker and OCI tools write them: [registry/]repository[:tag][@digest]."""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"
REPOSITORY = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
TAG = re.compile(r"[\w][\w.-]{0,127}")
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class BadReference(ValueError):
    pass


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]; docker.io for Docker Hub
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def endpoint(self) -> str:
        return DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """registry/repository, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    def with_tag(self, tag: str) -> Reference:
        return Reference(self.registry, self.repository, tag, None)

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> Reference:
    rest, digest = text.strip(), None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST.fullmatch(digest):
            raise BadReference(f"{text!r}: the digest must be sha256: and 64 hex digits")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not TAG.fullmatch(tag):
            raise BadReference(f"{text!r}: {tag!r} is not a valid tag")
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, remainder
    else:
        registry, repository = DOCKER_HUB, rest if "/" in rest else f"library/{rest}"
    if not REPOSITORY.fullmatch(repository):
        raise BadReference(
            f"{text!r}: {repository!r} is not a repository name (lower-case letters, digits, "
            "and . _ - between them, parts separated by /)"
        )
    return Reference(registry, repository, tag, digest)


def repository_in(registry: str, name: str) -> Reference:
    """The repository `name` under a registry setting such as ghcr.io/team or
    123456789012.dkr.ecr.us-east-1.amazonaws.com (host, and a path prefix if any)."""
    registry = registry.strip().rstrip("/")
    if "://" in registry:
        raise BadReference(
            f"registry {registry!r}: give host[:port][/path] without a scheme, e.g. ghcr.io/team"
        )
    reference = parse_reference(f"{registry}/{name}")
    if reference.tag or reference.digest:
        raise BadReference(f"registry {registry!r}: no tag or digest here, only host and path")
    if reference.registry == DOCKER_HUB and not registry.startswith(DOCKER_HUB):
        # "team" alone would mean Docker Hub's team/<name>: say so rather than guess
        raise BadReference(
            f"registry {registry!r}: name the registry's host, e.g. docker.io/{registry}, "
            "ghcr.io/team or localhost:5000"
        )
    return reference


def is_local(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry
    return host in LOCAL_HOSTS or registry.startswith("[::1]")

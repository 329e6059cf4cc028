"""A client of the OCI Distribution API, the few calls a push needs: manifests (HEAD, GET,
PUT), blobs (HEAD, GET, cross-repository mount, upload), with the registry's own auth scheme
(a bearer token from its realm, or basic). Credentials go only into Authorization headers:
never into a message, a log line or a URL."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from gpufleet.image.credentials import Credentials
from gpufleet.image.reference import is_local

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
CHUNK = 1 << 20
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
Progress = Callable[[int], None]  # bytes sent since the last call


class RegistryError(Exception):
    pass


class Registry:
    """One registry host. `insecure` (plain HTTP) is the default only for this machine's
    own registries (localhost, 127.0.0.1)."""

    def __init__(
        self,
        host: str,
        endpoint: str,
        credentials: Credentials | None,
        insecure: bool | None = None,
        timeout: float = 60,
    ) -> None:
        self.host = host
        self.insecure = is_local(endpoint) if insecure is None else insecure
        scheme = "http" if self.insecure else "https"
        self.base = f"{scheme}://{endpoint}"
        self.credentials = credentials
        self.http = httpx.Client(timeout=timeout, follow_redirects=True)
        self.tokens: dict[str, str] = {}  # scope -> bearer token
        self.sent = 0  # bytes uploaded through this client

    def close(self) -> None:
        self.http.close()

    # --- manifests ----------------------------------------------------------------------------

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest of a tag's (or digest's) manifest, or None when there is none."""
        answer = self._call(
            "HEAD", repository, f"manifests/{reference}", headers={"Accept": _accept()}
        )
        if answer.status_code == 404:
            return None
        self._check(answer, f"{repository}:{reference}")
        digest = answer.headers.get("Docker-Content-Digest")
        if digest:
            return str(digest)
        return self.manifest(repository, reference)[2]  # a registry that does not say

    def manifest(self, repository: str, reference: str) -> tuple[str, bytes, str]:
        """(media type, bytes, digest) of a manifest or index."""
        answer = self._call(
            "GET", repository, f"manifests/{reference}", headers={"Accept": _accept()}
        )
        if answer.status_code == 404:
            raise RegistryError(f"{self.host}/{repository}: no image {reference}")
        self._check(answer, f"{repository}:{reference}")
        body = answer.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"{self.host}/{repository}@{reference}: the registry sent a manifest of "
                f"another digest ({digest})"
            )
        media = answer.headers.get("Content-Type", "").split(";")[0]
        return media, body, digest

    def put_manifest(self, repository: str, tag: str, media_type: str, body: bytes) -> str:
        answer = self._call(
            "PUT",
            repository,
            f"manifests/{tag}",
            push=True,
            content=body,
            headers={"Content-Type": media_type},
        )
        self._check(answer, f"{repository}:{tag}")
        self.sent += len(body)
        return answer.headers.get("Docker-Content-Digest") or (
            "sha256:" + hashlib.sha256(body).hexdigest()
        )

    # --- blobs --------------------------------------------------------------------------------

    def has_blob(self, repository: str, digest: str) -> bool:
        answer = self._call("HEAD", repository, f"blobs/{digest}", push=True)
        if answer.status_code == 404:
            return False
        self._check(answer, f"{repository} blob {digest}")
        return True

    def blob(self, repository: str, digest: str) -> bytes:
        answer = self._call("GET", repository, f"blobs/{digest}")
        self._check(answer, f"{repository} blob {digest}")
        if "sha256:" + hashlib.sha256(answer.content).hexdigest() != digest:
            raise RegistryError(f"{self.host}/{repository}: blob {digest} arrived corrupted")
        return answer.content

    def stream_blob(self, repository: str, digest: str) -> Iterator[bytes]:
        """A blob in chunks, never whole in memory (a base image's layer may be gigabytes)."""
        scope = _scope(repository, False, None)
        url = self._url(repository, f"blobs/{digest}", False)
        try:
            for attempt in range(2):
                with self.http.stream("GET", url, headers=self._auth(scope)) as answer:
                    if (
                        answer.status_code == 401
                        and not attempt
                        and self._authenticate(answer, scope)
                    ):
                        continue  # again, with the token the challenge asked for
                    if answer.status_code >= 300:
                        answer.read()  # the registry's error body, for the message
                    self._check(answer, f"{repository} blob {digest}")
                    yield from answer.iter_bytes(CHUNK)
                    return
        except httpx.HTTPError as err:
            raise RegistryError(f"{self.host}: {_reason(err)}") from None

    def mount(self, repository: str, digest: str, source: str) -> bool:
        """Link a blob of another repository of this registry into `repository` without
        sending it; False when the registry cannot (the blob must then be uploaded)."""
        answer = self._call(
            "POST",
            repository,
            "blobs/uploads/",
            push=True,
            params={"mount": digest, "from": source},
            scope_from=source,
        )
        if answer.status_code == 201:
            return True
        self._check(answer, f"{repository} mount of {digest}")
        self._cancel(answer)  # 202: an upload was started instead; not needed
        return False

    def upload(
        self,
        repository: str,
        digest: str,
        size: int,
        content: Path | bytes | Iterator[bytes],
        progress: Progress | None = None,
    ) -> None:
        """Send a blob in one PUT (the monolithic upload every registry takes)."""
        answer = self._call("POST", repository, "blobs/uploads/", push=True)
        self._check(answer, f"{repository} upload")
        location = self._location(answer)
        separator = "&" if "?" in location else "?"
        answer = self._call(
            "PUT",
            repository,
            f"{location}{separator}digest={digest}",
            push=True,
            content=_chunks(content, progress),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            absolute=True,
        )
        self._check(answer, f"{repository} blob {digest}")
        self.sent += size

    # --- plumbing -----------------------------------------------------------------------------

    def _location(self, answer: httpx.Response) -> str:
        location = answer.headers.get("Location")
        if not location:
            raise RegistryError(f"{self.host}: an upload was started without a Location")
        return location if "://" in location else f"{self.base}{location}"

    def _cancel(self, answer: httpx.Response) -> None:
        location = answer.headers.get("Location")
        if location:
            # the registry forgets unfinished uploads on its own, if this fails
            with contextlib.suppress(httpx.HTTPError):
                self.http.delete(location if "://" in location else f"{self.base}{location}")

    def _url(self, repository: str, path: str, absolute: bool) -> str:
        return path if absolute else f"{self.base}/v2/{repository}/{path}"

    def _call(
        self,
        method: str,
        repository: str,
        path: str,
        *,
        push: bool = False,
        absolute: bool = False,
        scope_from: str | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        scope = _scope(repository, push, scope_from)
        url = self._url(repository, path, absolute)
        sent_headers = {**(headers or {}), **self._auth(scope)}
        try:
            answer = self.http.request(method, url, headers=sent_headers, **kwargs)
            if answer.status_code == 401 and self._authenticate(answer, scope):
                content = kwargs.get("content")
                if content is not None and not isinstance(content, bytes):
                    raise RegistryError(f"{self.host}: asked to log in half-way through a push")
                sent_headers = {**(headers or {}), **self._auth(scope)}
                answer = self.http.request(method, url, headers=sent_headers, **kwargs)
        except httpx.HTTPError as err:
            raise RegistryError(f"{self.host}: {_reason(err)}") from None
        return answer

    def _auth(self, scope: str) -> dict[str, str]:
        if scope in self.tokens:
            return {"Authorization": f"Bearer {self.tokens[scope]}"}
        if self.tokens.get("basic") and self.credentials:
            return {"Authorization": self.credentials.basic}
        return {}

    def _authenticate(self, answer: httpx.Response, scope: str) -> bool:
        """Answer the registry's challenge; False when it cannot be answered."""
        challenge = answer.headers.get("WWW-Authenticate", "")
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            if self.credentials is None:
                raise NoCredentials(self.host)
            self.tokens["basic"] = "yes"
            return True
        if kind != "bearer":
            return False
        fields = dict(CHALLENGE.findall(challenge))
        realm = fields.get("realm")
        if not realm:
            raise RegistryError(f"{self.host}: its login challenge names no realm")
        # each scope its own parameter, as token services read them
        params = [("service", fields.get("service", ""))] + [
            ("scope", each) for each in (fields.get("scope") or scope).split()
        ]
        headers = {"Authorization": self.credentials.basic} if self.credentials else {}
        try:
            got = self.http.get(realm, params=params, headers=headers)
        except httpx.HTTPError as err:
            raise RegistryError(f"{self.host}: its token service: {_reason(err)}") from None
        if got.status_code in (401, 403):
            if self.credentials is None:
                raise NoCredentials(self.host)
            raise RegistryError(
                f"{self.host}: the credentials from {self.credentials.source} were refused "
                f"({got.status_code}); log in again"
            )
        if got.status_code != 200:
            raise RegistryError(f"{self.host}: its token service answered {got.status_code}")
        data = got.json()
        token = data.get("token") or data.get("access_token")
        if not token:
            raise RegistryError(f"{self.host}: its token service sent no token")
        self.tokens[scope] = token
        return True

    def _check(self, answer: httpx.Response, what: str) -> None:
        if answer.status_code < 300:
            return
        if answer.status_code == 401:
            if self.credentials is None:
                raise NoCredentials(self.host)
            raise RegistryError(
                f"{self.host}: {what}: the credentials from {self.credentials.source} were "
                "refused; log in again"
            )
        if answer.status_code == 403:
            raise RegistryError(f"{self.host}: {what}: not allowed (403); check your access")
        detail = _errors(answer)
        raise RegistryError(f"{self.host}: {what}: {answer.status_code}{detail}")


class NoCredentials(RegistryError):
    def __init__(self, host: str) -> None:
        super().__init__(
            f"{host} asks for a login and none was found: log in (docker login {host}, or "
            f"podman login), or run gpufleet run on a terminal to be asked"
        )
        self.host = host


def _scope(repository: str, push: bool, source: str | None) -> str:
    scope = f"repository:{repository}:{'pull,push' if push else 'pull'}"
    return f"{scope} repository:{source}:pull" if source else scope


def _accept() -> str:
    return ", ".join(MANIFEST_TYPES)


def _chunks(content: Path | bytes | Iterator[bytes], progress: Progress | None) -> Any:
    if isinstance(content, bytes):
        if progress:
            progress(len(content))
        return content
    return _counted(content, progress)


def _counted(content: Path | Iterator[bytes], progress: Progress | None) -> Iterator[bytes]:
    if isinstance(content, Path):
        with content.open("rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                if progress:
                    progress(len(chunk))
                yield chunk
        return
    for chunk in content:
        if progress:
            progress(len(chunk))
        yield chunk


def _errors(answer: httpx.Response) -> str:
    try:
        errors = answer.json().get("errors") or []
    except ValueError:
        return ""
    messages = [f"{e.get('code', '')} {e.get('message', '')}".strip() for e in errors]
    return f" ({'; '.join(messages)})" if messages else ""


def _reason(err: httpx.HTTPError) -> str:
    if isinstance(err, httpx.ConnectError):
        return f"cannot connect ({err}); is the registry's address right and is it running?"
    if isinstance(err, httpx.TimeoutException):
        return "timed out; is the registry reachable from here?"
    return str(err)

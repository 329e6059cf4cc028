"""Registry credentials, found where the usual tools keep them: Amazon ECR (boto3's credentials:
an authorization token, the repository made if missing), Google Artifact Registry and GCR
(google-auth's default credentials), and the Docker config (credential helpers, credsStore,
auths) that `docker login`, `podman login` and `crane auth login` write. Never printed."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ECR_HOST = re.compile(r"(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
GOOGLE_HOST = re.compile(r"(?:[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io)")
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")


class CredentialsError(Exception):
    pass


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""  # where they came from, for messages

    @property
    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def credentials_for(registry: str) -> Credentials | None:
    """The credentials for a registry host, or None (anonymous pulls still work)."""
    if ECR_HOST.fullmatch(registry):
        return ecr_credentials(registry)
    found = docker_config_credentials(registry)
    if found is not None:
        return found
    if GOOGLE_HOST.fullmatch(registry):
        return google_credentials()
    return None


def docker_config_credentials(registry: str) -> Credentials | None:
    path = docker_config_path()
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CredentialsError(f"{path}: not valid JSON ({err}); fix or remove it") from None
    keys = DOCKER_HUB_KEYS if registry == "docker.io" else (registry, f"https://{registry}")
    helper = next(
        (config.get("credHelpers", {}).get(k) for k in keys if k in config.get("credHelpers", {})),
        config.get("credsStore"),
    )
    if helper:
        found = _from_helper(helper, keys[0])
        if found is not None:
            return found
    for key in keys:
        entry = (config.get("auths") or {}).get(key)
        if not entry:
            continue
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError:
                raise CredentialsError(
                    f"{path}: the auth of {key} is not base64 of user:password; log in again"
                ) from None
            return Credentials(user, password, str(path))
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], str(path))
        if entry.get("identitytoken"):
            return Credentials("<token>", entry["identitytoken"], str(path))
    return None


def save_docker_login(registry: str, username: str, password: str) -> Path:
    """Store a login in the Docker config, as `docker login` does without a helper."""
    path = docker_config_path()
    config = json.loads(path.read_text()) if path.is_file() else {}
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    config.setdefault("auths", {})[registry] = {"auth": auth}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def _from_helper(helper: str, server: str) -> Credentials | None:
    program = f"docker-credential-{helper}"
    try:
        answer = subprocess.run(
            [program, "get"], input=server, capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        raise CredentialsError(
            f"{docker_config_path()} names the credential helper {helper!r}, but {program} is "
            "not on PATH; install it or remove it from the config"
        ) from None
    if answer.returncode != 0:
        return None  # the helper holds nothing for this registry
    try:
        data = json.loads(answer.stdout)
    except ValueError:
        raise CredentialsError(f"{program} get: answered something that is not JSON") from None
    return Credentials(data.get("Username", ""), data.get("Secret", ""), program)


def ecr_credentials(registry: str) -> Credentials:
    account, region = _ecr(registry)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = boto3.client("ecr", region_name=region).get_authorization_token(
            registryIds=[account]
        )
    except (BotoCoreError, ClientError) as err:
        raise CredentialsError(
            f"Amazon ECR {registry}: no authorization token ({err}); check your AWS "
            "credentials (aws sts get-caller-identity) and ecr:GetAuthorizationToken"
        ) from None
    token = answer["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    return Credentials(user, password, "Amazon ECR")


def ensure_ecr_repository(registry: str, repository: str) -> bool:
    """Make the ECR repository if it is missing (ECR, unlike most registries, does not make
    one on the first push); True if it was made."""
    account, region = _ecr(registry)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    ecr = boto3.client("ecr", region_name=region)
    try:
        ecr.describe_repositories(registryId=account, repositoryNames=[repository])
        return False
    except ClientError as err:
        if err.response["Error"]["Code"] != "RepositoryNotFoundException":
            raise CredentialsError(f"Amazon ECR {registry}/{repository}: {err}") from None
    except BotoCoreError as err:
        raise CredentialsError(f"Amazon ECR {registry}: {err}") from None
    try:
        ecr.create_repository(registryId=account, repositoryName=repository)
    except (BotoCoreError, ClientError) as err:
        raise CredentialsError(
            f"Amazon ECR {registry}: cannot create the repository {repository} ({err}); "
            "create it, or allow ecr:CreateRepository"
        ) from None
    return True


def _ecr(registry: str) -> tuple[str, str]:
    match = ECR_HOST.fullmatch(registry)
    if match is None:
        raise CredentialsError(f"{registry} is not an Amazon ECR registry")
    return match.group(1), match.group(2)


def google_credentials() -> Credentials:
    try:
        import google.auth
        import google.auth.transport.requests
        from google.auth.exceptions import GoogleAuthError

        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
        credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
    except (GoogleAuthError, OSError) as err:
        raise CredentialsError(
            f"Google Artifact Registry: no credentials ({err}); run gcloud auth "
            "application-default login, or set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    return Credentials("oauth2accesstoken", str(credentials.token), "google-auth")

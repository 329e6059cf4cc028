"""`gpufleet run` without a registry or a cluster: detection, settings, the plan, the
Dockerfile, layers, references, credentials, and --dry-run."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import boto3
import pytest
import yaml
from moto import mock_aws

from gpufleet.image.build import inputs_tag
from gpufleet.image.credentials import (
    Credentials,
    credentials_for,
    docker_config_credentials,
    ensure_ecr_repository,
    save_docker_login,
)
from gpufleet.image.layers import folder_layer, project_files
from gpufleet.image.reference import BadReference, parse_reference, repository_in
from gpufleet.project.config import (
    RunConfig,
    load_project_config,
    load_user_config,
    profile_of,
    save_profile,
)
from gpufleet.project.detect import ProjectError, detect
from gpufleet.project.dockerfile import dockerfile
from gpufleet.project.plan import plan

PROJECTS = Path(__file__).parent / "data" / "run_projects"


@pytest.fixture
def project(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A copy of a sample project (the parameter names which), free to change."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / request.param, folder)
    return folder


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


# --- detection --------------------------------------------------------------------------------


def test_detects_a_pytorch_layout() -> None:
    found = detect(PROJECTS / "pytorch")
    assert found.framework == "pytorch"
    assert found.entrypoint == "train.py"
    assert found.python == "3.11"
    assert found.launcher is None
    assert found.requirements.source == "requirements.txt"
    assert found.requirements.names == ("torch", "tinyutil")


def test_detects_a_jax_layout_from_pyproject() -> None:
    found = detect(PROJECTS / "jax")
    assert (found.framework, found.entrypoint, found.python) == ("jax", "main.py", "3.11")
    assert found.requirements.source == "pyproject.toml"


def test_detects_a_tensorflow_layout_from_setup_py() -> None:
    found = detect(PROJECTS / "tensorflow")
    assert (found.framework, found.entrypoint) == ("tensorflow", "run.py")
    assert found.requirements.lines == ("tensorflow==0.0.1",)


def test_detects_torchrun_from_the_code() -> None:
    assert detect(PROJECTS / "torchrun").launcher == "torchrun"


@pytest.mark.parametrize(
    ("source", "requirements", "launcher"),
    [
        ("import ray\n", "", "ray"),
        ("import horovod.torch as hvd\n", "torch\n", "horovod"),
        ("import deepspeed\n", "torch\n", "deepspeed"),
        ("from accelerate import Accelerator\n", "torch\naccelerate\n", "accelerate"),
        ("print('hi')\n", "torch\n", None),
    ],
)
def test_detects_the_launcher(tmp_path: Path, source: str, requirements: str,
                              launcher: str | None) -> None:  # fmt: skip
    (tmp_path / "train.py").write_text(source)
    (tmp_path / "requirements.txt").write_text(requirements)
    assert detect(tmp_path).launcher == launcher


def test_no_entrypoint_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("")
    with pytest.raises(ProjectError, match=r"no entrypoint found.*--entrypoint"):
        plan(detect(tmp_path), RunConfig())


def test_an_entrypoint_that_is_not_there_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match=r"'go\.py' is not a file of the project"):
        detect(tmp_path, "go.py")


# --- settings ---------------------------------------------------------------------------------


def test_the_project_file_is_read_and_checked(tmp_path: Path) -> None:
    config = load_project_config(PROJECTS / "jax")
    assert config.name == "jax-demo"
    assert config.entrypoint_args == ["--steps", "10"]
    assert config.env == {"STEPS": "10", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    (tmp_path / ".gpufleet.yaml").write_text("name: demo\ngpu: 4\n")
    with pytest.raises(ProjectError) as err:
        load_project_config(tmp_path)
    assert ".gpufleet.yaml:2" in str(err.value) and "'gpu'" in str(err.value)
    assert "did you mean 'gpus'" in str(err.value)


def test_profiles_of_the_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("GPUFLEET_CONFIG", str(path))
    monkeypatch.delenv("GPUFLEET_PROFILE", raising=False)
    assert profile_of(load_user_config(), None).registry is None
    save_profile("default", {"registry": "ghcr.io/me"})
    save_profile("work", {"registry": "localhost:5000/ml", "team": "nlp"})
    save_profile("default", {"team": "research"})  # kept: the registry saved before
    config = load_user_config()
    assert profile_of(config, None).model_dump(exclude_none=True) == {
        "registry": "ghcr.io/me",
        "team": "research",
    }
    assert profile_of(config, "work").team == "nlp"
    monkeypatch.setenv("GPUFLEET_PROFILE", "work")
    assert profile_of(config, None).registry == "localhost:5000/ml"
    with pytest.raises(ProjectError, match=r"no profile 'home'.*default, work"):
        profile_of(config, "home")


# --- the plan -----------------------------------------------------------------------------------


def test_plan_of_a_pytorch_project() -> None:
    chosen = plan(detect(PROJECTS / "pytorch"), RunConfig(gpus=4))
    assert chosen.base.image.startswith("pytorch/pytorch:")
    assert chosen.skipped == ("torch==0.0.1",)  # the base image holds torch
    assert chosen.requirements == ("tinyutil==0.0.1",)
    assert chosen.command == ("python3", "train.py")
    assert (chosen.kind, chosen.gpus, chosen.name) == ("job", 4, "pytorch")


def test_plan_of_distributed_runs() -> None:
    torchrun = detect(PROJECTS / "torchrun")
    one = plan(torchrun, RunConfig(gpus=8))
    assert one.command == ("torchrun", "--nproc_per_node=8", "train.py")
    assert one.kind == "job"
    assert plan(torchrun, RunConfig(gpus=8, nodes=4)).kind == "trainjob"
    accelerate = plan(torchrun, RunConfig(gpus=8, nodes=2, launcher="accelerate"))
    assert accelerate.command[:3] == ("accelerate", "launch", "--num_processes=16")
    assert accelerate.kind == "jobset"
    assert plan(torchrun, RunConfig(launcher="ray", nodes=2)).kind == "rayjob"
    assert plan(torchrun, RunConfig(launcher="python")).command == ("python3", "train.py")


def test_a_python_the_framework_image_does_not_hold() -> None:
    """No framework image for that Python: the Python image, the framework from PyPI."""
    chosen = plan(detect(PROJECTS / "pytorch"), RunConfig(python="3.12"))
    assert chosen.base.image == "python:3.12-slim" and chosen.python == "3.12"
    assert chosen.skipped == () and "torch==0.0.1" in chosen.requirements
    given = plan(detect(PROJECTS / "jax"), RunConfig(base_image="me/py:3.13", python="3.13"))
    assert (given.base.image, given.python) == ("me/py:3.13", "3.13")


def test_the_dockerfile_says_what_the_image_holds() -> None:
    chosen = plan(detect(PROJECTS / "pytorch"), RunConfig(entrypoint_args=["--epochs", "3"]))
    text = dockerfile(chosen)
    assert text.splitlines()[1] == f"FROM {chosen.base.image}"
    assert "--target /opt/gpufleet/deps tinyutil==0.0.1" in text
    assert "# provided by the base image: torch==0.0.1" in text
    assert 'CMD ["python3", "train.py", "--epochs", "3"]' in text


# --- files and layers -------------------------------------------------------------------------


@pytest.mark.parametrize("project", ["pytorch"], indirect=True)
def test_ignored_files_stay_out_of_the_image(project: Path) -> None:
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"0" * 1000)
    (project / "last.ckpt").write_text("x")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"x")
    (project / "notes.md").write_text("x")
    files = project_files(project, ["notes.md"])
    assert files == [
        ".gitignore",
        ".python-version",
        "model/__init__.py",
        "requirements.txt",
        "train.py",
    ]


@pytest.mark.parametrize("project", ["pytorch"], indirect=True)
def test_layers_depend_only_on_their_files(project: Path, tmp_path: Path) -> None:
    files = project_files(project)
    first = folder_layer(project, files, "/workspace", tmp_path / "a.tar.gz")
    os.utime(project / "train.py", (1, 1))  # a new mtime, the same content
    (project / "train.py").chmod(0o600)  # another umask: not executable either way
    again = folder_layer(project, files, "/workspace", tmp_path / "b.tar.gz")
    assert (first.digest, first.diff_id) == (again.digest, again.diff_id)
    with tarfile.open(first.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members)[:2] == ["workspace", "workspace/.gitignore"]
    assert members["workspace/train.py"].mode == 0o644
    assert {m.mtime for m in members.values()} == {0}
    assert {(m.uid, m.gid) for m in members.values()} == {(0, 0)}
    raw = first.path.read_bytes()
    assert "sha256:" + __import__("hashlib").sha256(gzip.decompress(raw)).hexdigest() == (
        first.diff_id
    )
    (project / "train.py").write_text("print('changed')\n")
    changed = folder_layer(project, files, "/workspace", tmp_path / "c.tar.gz")
    assert changed.digest != first.digest


@pytest.mark.parametrize("project", ["pytorch"], indirect=True)
def test_the_tag_changes_with_every_input(project: Path) -> None:
    chosen = plan(detect(project), RunConfig(base_image="localhost:5000/base:3.11"))
    files = project_files(project)
    tag = inputs_tag(chosen, project, files, "linux/amd64")
    assert tag == inputs_tag(chosen, project, files, "linux/amd64")
    assert tag != inputs_tag(chosen, project, files, "linux/arm64")
    other = plan(detect(project), RunConfig(base_image="localhost:5000/base:3.11",
                                            entrypoint_args=["--lr", "1"]))  # fmt: skip
    assert tag != inputs_tag(other, project, files, "linux/amd64")
    (project / "model" / "__init__.py").write_text("LAYERS = 3\n")
    assert tag != inputs_tag(chosen, project, files, "linux/amd64")


# --- references and credentials -------------------------------------------------------------


def test_references() -> None:
    hub = parse_reference("python:3.11-slim")
    assert (hub.registry, hub.repository, hub.tag) == ("docker.io", "library/python", "3.11-slim")
    assert hub.endpoint == "registry-1.docker.io"
    local = parse_reference("localhost:5000/ml/train@sha256:" + "a" * 64)
    assert (local.registry, local.repository, local.tag) == ("localhost:5000", "ml/train", None)
    assert str(repository_in("ghcr.io/team", "demo")) == "ghcr.io/team/demo"
    for bad in ("Upper/Case", "x@sha256:12", "localhost:5000/a:b:c"):
        with pytest.raises(BadReference):
            parse_reference(bad)
    with pytest.raises(BadReference, match="name the registry's host"):
        repository_in("team", "demo")
    with pytest.raises(BadReference, match="without a scheme"):
        repository_in("https://ghcr.io/team", "demo")


def test_docker_config_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert docker_config_credentials("ghcr.io") is None
    save_docker_login("ghcr.io", "me", "s3cret")
    found = docker_config_credentials("ghcr.io")
    assert found == Credentials("me", "s3cret", str(tmp_path / "config.json"))
    assert "s3cret" not in repr(found)  # never printed
    assert (tmp_path / "config.json").stat().st_mode & 0o077 == 0
    hub = {"auths": {"https://index.docker.io/v1/": {
        "auth": base64.b64encode(b"hubuser:hubpass").decode()}}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hub))
    assert credentials_for("docker.io") == Credentials(
        "hubuser", "hubpass", str(tmp_path / "config.json")
    )
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "nowhere"}))
    with pytest.raises(Exception, match="docker-credential-nowhere is not on PATH"):
        credentials_for("ghcr.io")


@mock_aws
def test_ecr_token_and_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    found = credentials_for(registry)
    assert found is not None and found.username == "AWS" and found.password
    assert ensure_ecr_repository(registry, "ml/demo") is True
    assert ensure_ecr_repository(registry, "ml/demo") is False  # made once
    names = [
        r["repositoryName"]
        for r in boto3.client("ecr", region_name="us-east-1").describe_repositories()[
            "repositories"
        ]
    ]
    assert names == ["ml/demo"]


# --- the command, with nothing to reach -------------------------------------------------------


def test_dry_run_prints_the_dockerfile_and_the_manifest(tmp_path: Path) -> None:
    saved = tmp_path / "Dockerfile"
    done = cli(
        "run", str(PROJECTS / "jax"), "--dry-run", "--team", "research",
        "--registry", "localhost:5000/ml", "--save-dockerfile", str(saved), "-e", "SEED=7",
        env={"GPUFLEET_CONFIG": str(tmp_path / "none.yaml"), "GPUFLEET_TEST_TOKEN": "t0ken"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    comments = [line for line in done.stdout.splitlines() if line.startswith("#")]
    assert "# FROM python:3.11-slim" in comments
    assert saved.read_text().splitlines()[1] == "FROM python:3.11-slim"
    job = yaml.safe_load(done.stdout)
    assert job["kind"] == "Job" and job["metadata"]["name"].startswith("jax-demo-")
    assert job["metadata"]["labels"]["gpufleet.io/team"] == "research"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("localhost:5000/ml/jax-demo:")
    assert container["command"] == ["python3", "main.py", "--steps", "10"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["STEPS"] == "10" and env["SEED"] == "7"
    assert "t0ken" not in done.stdout  # forwarded values are not shown
    assert env["GPUFLEET_TEST_TOKEN"] == "(forwarded from your environment)"


def test_bad_input_gets_one_clear_message(tmp_path: Path) -> None:
    env = {"GPUFLEET_CONFIG": str(tmp_path / "none.yaml")}
    (tmp_path / "empty").mkdir()
    done = cli("run", str(tmp_path / "empty"), "--dry-run", env=env)
    assert done.returncode == 1 and "no entrypoint found" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("run", str(PROJECTS / "pytorch"), "--no-submit", env=env)
    assert done.returncode == 1 and "no registry to push the image to" in done.stderr
    done = cli("run", str(PROJECTS / "pytorch"), "--team", "x", "--registry", "ml", env=env)
    assert done.returncode == 1 and "name the registry's host" in done.stderr
    done = cli("run", str(PROJECTS / "pytorch"), "--registry", "localhost:5000", env=env)
    assert done.returncode == 1 and "no team" in done.stderr
    done = cli("run", str(PROJECTS / "pytorch"), "--dry-run", "-e", "NOEQUALS", env=env)
    assert done.returncode == 1 and "write KEY=VALUE" in done.stderr
    done = cli("run", str(PROJECTS / "pytorch"), "--dry-run", "--name", "Bad_Name", env=env)
    assert done.returncode == 1 and "name: String should match pattern" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one line, no pydantic dump
    done = cli(
        "run", str(PROJECTS / "pytorch"), "--no-submit", "--registry", "localhost:5000",
        "--dockerfile", "Dockerfile", env={**env, "PATH": "/nonexistent"},
    )  # fmt: skip
    assert done.returncode == 1 and "needs buildah, podman or docker" in done.stderr


def test_layers_read_back_as_tar(tmp_path: Path) -> None:
    """A layer is a gzipped tar any tool reads: the names it holds, with folders first."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a")
    layer = folder_layer(tmp_path, ["src/a.py"], "/workspace", tmp_path / "l.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(layer.path.read_bytes()), mode="r:gz") as tar:
        assert tar.getnames() == ["workspace", "workspace/src", "workspace/src/a.py"]


@pytest.mark.parametrize(
    ("launcher", "nodes", "kind", "gpu_pods"),
    [
        ("python", 1, "Job", 1),
        ("python", 3, "JobSet", 3),
        ("torchrun", 3, "TrainJob", 3),
        ("ray", 3, "RayJob", 3),
    ],
)
def test_each_kind_is_one_gpufleet_manages(
    tmp_path: Path, launcher: str, nodes: int, kind: str, gpu_pods: int
) -> None:
    """The manifest of each kind is read by its adapter as the run asked: NODES pods of
    GPUS GPUs (a RayJob's head has none), the image, the team's labels."""
    from gpufleet.kube.kinds import kind_of

    done = cli(
        "run", str(PROJECTS / "torchrun"), "--dry-run", "--team", "llm", "--gpus", "4",
        "--nodes", str(nodes), "-o", "json", "--registry", "localhost:5000",
        env={"GPUFLEET_CONFIG": str(tmp_path / "none.yaml")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the launcher from the config: a copy of the project with it set
    if launcher != "torchrun":
        project = tmp_path / "p"
        shutil.copytree(PROJECTS / "torchrun", project)
        (project / ".gpufleet.yaml").write_text(f"launcher: {launcher}\n")
        done = cli(
            "run", str(project), "--dry-run", "--team", "llm", "--gpus", "4", "--nodes",
            str(nodes), "-o", "json", "--registry", "localhost:5000",
            env={"GPUFLEET_CONFIG": str(tmp_path / "none.yaml")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    adapter = kind_of(manifest)
    assert adapter is not None and adapter.kind == kind
    assert manifest["metadata"]["labels"]["gpufleet.io/team"] == "llm"
    with_gpus = [
        s
        for s in adapter.pod_sets(manifest)
        for c in s.template.get("spec", {}).get("containers", [])
        if c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == "4"
    ]
    assert sum(s.count for s in with_gpus) == gpu_pods
    images = {
        c.get("image")
        for s in adapter.pod_sets(manifest)
        for c in s.template.get("spec", {}).get("containers", [])
    }
    if kind == "TrainJob":  # no pod template: its runtime has; the trainer names the image
        images = {manifest["spec"]["trainer"]["image"]}
    assert len(images) == 1 and str(images.pop()).startswith("localhost:5000/")


def test_google_credentials_from_a_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Artifact Registry's login: google-auth's default credentials (here a service-account
    key whose token endpoint is a local server) give an access token, used as the password
    of the user oauth2accesstoken."""
    import http.server
    import threading
    import urllib.parse

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from gpufleet.image.credentials import google_credentials

    asked: list[dict[str, list[str]]] = []

    class TokenEndpoint(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            asked.append(urllib.parse.parse_qs(self.rfile.read(length).decode()))
            body = json.dumps({"access_token": "ya29.test-token", "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    account = tmp_path / "sa.json"
    account.write_text(json.dumps({
        "type": "service_account", "project_id": "demo", "private_key_id": "k1",
        "private_key": pem, "client_email": "pusher@demo.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": f"http://127.0.0.1:{server.server_address[1]}/token",
    }))  # fmt: skip
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no Docker login for the host
    try:
        found = credentials_for("us-docker.pkg.dev")
        assert found == google_credentials()
        assert found is not None and found.username == "oauth2accesstoken"
        assert found.password == "ya29.test-token"
        assert asked and asked[0]["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    finally:
        server.shutdown()

"""`gpufleet run --no-submit` against a real registry (Debian's docker-registry, the `registry`
fixture) on a small base image built here, with dependencies from small local wheels; the
pushed image pulled and run by a real containerd and runc."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import skip_unless_ci

from gpufleet.testing.cluster import default_bin_dir
from gpufleet.testing.containerd import Containerd
from gpufleet.testing.containerd import missing as missing_containerd
from gpufleet.testing.registry import RegistryServer

PROJECTS = Path(__file__).parent / "data" / "run_projects"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(PROJECTS / "pytorch", folder)
    return folder


def run(registry: RegistryServer, env: dict[str, str], project: Path, *args: str,
        check: bool = True) -> Any:  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", str(project), "--no-submit", "-o", "json",
         "--registry", f"{registry.host}/ml", "--base-image", f"{registry.host}/base/python:3.11",
         *args],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if not check:
        return done
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def manifest(registry: RegistryServer, reference: str) -> dict[str, Any]:
    repository, _, digest = reference.partition("@")
    repository = repository.removeprefix(f"{registry.host}/")
    answer = httpx.get(
        f"http://{registry.host}/v2/{repository}/manifests/{digest}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    answer.raise_for_status()
    data: dict[str, Any] = answer.json()
    return data


def tags(registry: RegistryServer, repository: str) -> list[str]:
    answer = httpx.get(f"http://{registry.host}/v2/{repository}/tags/list")
    if answer.status_code == 404:
        return []
    return list(answer.json().get("tags") or [])


def test_build_push_rerun_and_one_file_change(
    registry: RegistryServer, run_environment: dict[str, str], project: Path
) -> None:
    first = run(registry, run_environment, project, "--entrypoint-args", "--epochs 3")
    assert first["built"] is True
    # the base's layer is mounted from its repository, never sent through this machine
    assert first["blobsMounted"] == 1
    assert first["blobsPushed"] == 3  # dependencies, code, config
    layers = [layer["digest"] for layer in manifest(registry, first["image"])["layers"]]
    assert len(layers) == 3

    again = run(registry, run_environment, project, "--entrypoint-args", "--epochs 3")
    assert again["built"] is False and again["bytesPushed"] == 0
    assert again["image"] == first["image"]

    (project / "train.py").write_text((project / "train.py").read_text() + "# one change\n")
    changed = run(registry, run_environment, project, "--entrypoint-args", "--epochs 3")
    assert changed["built"] is True and changed["image"] != first["image"]
    assert changed["blobsPushed"] == 2  # the code layer and the config only
    now = [layer["digest"] for layer in manifest(registry, changed["image"])["layers"]]
    assert now[:2] == layers[:2] and now[2] != layers[2]
    code = manifest(registry, changed["image"])["layers"][2]["size"]
    config = manifest(registry, changed["image"])["config"]["size"]
    # what was sent: the code layer, the config and the manifest, nothing else
    assert changed["bytesPushed"] < code + config + 4096

    # --no-cache builds again (pip too): the same inputs make the same image, byte for byte,
    # and every blob is found in the registry
    rebuilt = run(registry, run_environment, project, "--entrypoint-args", "--epochs 3",
                  "--no-cache")  # fmt: skip
    assert rebuilt["built"] is True and rebuilt["image"] == changed["image"]
    assert (rebuilt["blobsPushed"], rebuilt["blobsMounted"]) == (0, 0)
    shown = subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", str(project), "--no-submit", "-o", "yaml",
         "--registry", f"{registry.host}/ml", "--base-image", f"{registry.host}/base/python:3.11",
         "--entrypoint-args", "--epochs 3"],
        capture_output=True, text=True, env=run_environment,
    )  # fmt: skip
    assert yaml.safe_load(shown.stdout)["image"] == changed["image"]


def test_the_pushed_image_runs_in_a_real_runtime(
    registry: RegistryServer, run_environment: dict[str, str], project: Path
) -> None:
    bin_dir = default_bin_dir()
    missing = missing_containerd(bin_dir)
    if missing:
        skip_unless_ci(f"missing in {bin_dir}: {', '.join(missing)} (hack/k8s/build.sh)")
    if os.geteuid() != 0:
        skip_unless_ci("containerd needs root, as a node's does: run the tests as root")
    pushed = run(registry, run_environment, project, "--entrypoint-args", "--epochs 3")
    with Containerd(bin_dir) as containerd:
        containerd.pull(pushed["image"])
        printed = containerd.run(pushed["image"], env={"EPOCHS": "3"})
        assert printed.strip() == (
            "train.py ran: torch 0.0.1, tinyutil 42, python 3.11, EPOCHS=3, args=['--epochs', '3']"
        )
        # a dependency's console script runs with the image's python3 (not this machine's)
        assert containerd.run(pushed["image"], "tinyutil").strip() == "tinyutil 42"
        assert containerd.run(pushed["image"], "ls", "/workspace").split() == [
            "model",
            "requirements.txt",
            "train.py",
        ]


def test_refusals_push_nothing(
    registry: RegistryServer, run_environment: dict[str, str], project: Path
) -> None:
    (project / ".python-version").write_text("3.12\n")
    done = run(registry, run_environment, project, "--name", "py312", check=False)
    assert done.returncode == 1
    assert "holds Python 3.11, not 3.12" in done.stderr and "Traceback" not in done.stderr
    assert tags(registry, "ml/py312") == []

    (project / ".python-version").write_text("3.11\n")
    (project / "requirements.txt").write_text("no-such-package==1.0\n")
    done = run(registry, run_environment, project, "--name", "nowheel", check=False)
    assert done.returncode == 1 and "only wheels are used" in done.stderr
    assert tags(registry, "ml/nowheel") == []

    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", str(project), "--no-submit",
         "--registry", "127.0.0.1:9/ml"],
        capture_output=True, text=True, env=run_environment,
    )  # fmt: skip
    assert done.returncode == 1 and "cannot connect" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_dockerfile_built_by_buildah(
    registry: RegistryServer, run_environment: dict[str, str], project: Path, tmp_path: Path
) -> None:
    if shutil.which("buildah") is None:
        skip_unless_ci("buildah not found: apt-get install buildah (make test)")
    storage = tmp_path / "storage.conf"  # buildah's images in the test's own folder
    storage.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path / "graph"}"\n'
        f'runroot = "{tmp_path / "run"}"\n'
    )
    env = {**run_environment, "CONTAINERS_STORAGE_CONF": str(storage)}
    (project / "Dockerfile").write_text(
        f"FROM {registry.host}/base/python:3.11\nCOPY train.py /app/train.py\n"
        'CMD ["python3", "/app/train.py"]\n'
    )
    first = run(registry, env, project, "--dockerfile", str(project / "Dockerfile"),
                "--name", "built")  # fmt: skip
    assert first["built"] is True
    # the digest said is the one the registry serves for the tag
    tag = first["tag"].rsplit(":", 1)[1]
    answer = httpx.head(
        f"http://{registry.host}/v2/ml/built/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                 "application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    assert first["image"].endswith("@" + answer.headers["Docker-Content-Digest"])
    again = run(registry, env, project, "--dockerfile", str(project / "Dockerfile"),
                "--name", "built")  # fmt: skip
    assert again["built"] is False and again["image"] == first["image"]


def test_a_registry_that_asks_for_a_login(
    run_environment: dict[str, str], project: Path, tmp_path: Path
) -> None:
    """The registry's token auth: a bearer token from its token service, asked for with the
    login in the Docker config; no login, or a wrong one, is refused with what to do, and
    the password is never printed."""
    from gpufleet.image.credentials import Credentials
    from gpufleet.image.registry import Registry
    from gpufleet.testing.registry import BASE_ARCHIVE, TokenService, push_layout, registry_binary

    binary = registry_binary()
    if binary is None or not BASE_ARCHIVE.is_file():
        skip_unless_ci("docker-registry or the base image (make image) not found")
    tokens = TokenService("ml-bot", "pa55-word")
    try:
        with RegistryServer(binary, tokens) as server:
            client = Registry(server.host, server.host, Credentials("ml-bot", "pa55-word"))
            push_layout(BASE_ARCHIVE, client, "base/python", "3.11")
            client.close()
            docker = tmp_path / "docker"
            docker.mkdir()
            env = {**run_environment, "DOCKER_CONFIG": str(docker)}
            (docker / "config.json").write_text("{}")
            done = run(server, env, project, "--name", "private", check=False)
            assert done.returncode == 1
            assert f"{server.host} asks for a login and none was found" in done.stderr

            login = base64.b64encode(b"ml-bot:wrong-pass").decode()
            (docker / "config.json").write_text(
                json.dumps({"auths": {server.host: {"auth": login}}})
            )
            done = run(server, env, project, "--name", "private", check=False)
            assert done.returncode == 1 and "were refused" in done.stderr
            assert "wrong-pass" not in done.stderr + done.stdout

            login = base64.b64encode(b"ml-bot:pa55-word").decode()
            (docker / "config.json").write_text(
                json.dumps({"auths": {server.host: {"auth": login}}})
            )
            issued = tokens.issued
            pushed = run(server, env, project, "--name", "private")
            assert pushed["built"] is True and pushed["blobsMounted"] == 1
            assert tokens.issued > issued
            assert "pa55-word" not in json.dumps(pushed)
    finally:
        tokens.stop()


@pytest.mark.timeout(240)
def test_first_run_on_a_terminal_asks_and_saves(
    run_environment: dict[str, str], project: Path, tmp_path: Path
) -> None:
    """On a terminal, no registry and no login are asked for, and saved: the registry in the
    profile of the user config, the login in the Docker config; the next run asks nothing."""
    from gpufleet.image.credentials import Credentials
    from gpufleet.image.registry import Registry
    from gpufleet.testing.registry import BASE_ARCHIVE, TokenService, push_layout, registry_binary

    binary = registry_binary()
    if binary is None or not BASE_ARCHIVE.is_file():
        skip_unless_ci("docker-registry or the base image (make image) not found")
    tokens = TokenService("ml-bot", "pa55-word")
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text("{}")
    config = tmp_path / "config.yaml"
    env = {**run_environment, "DOCKER_CONFIG": str(docker), "GPUFLEET_CONFIG": str(config),
           "COLUMNS": "200"}  # fmt: skip
    try:
        with RegistryServer(binary, tokens) as server:
            client = Registry(server.host, server.host, Credentials("ml-bot", "pa55-word"))
            push_layout(BASE_ARCHIVE, client, "base/python", "3.11")
            client.close()
            command = [sys.executable, "-m", "gpufleet", "run", str(project), "--no-submit",
                       "-o", "json", "--base-image", f"{server.host}/base/python:3.11"]  # fmt: skip
            answers = [
                ("Registry to push images to", f"{server.host}/ml"),
                ("Username", "ml-bot"),
                ("Password or token", "pa55-word"),
            ]
            code, stdout, screen = on_terminal(command, env, answers)
            assert code == 0, screen
            assert json.loads(stdout)["built"] is True
            assert "pa55-word" not in screen  # typed without echo
            assert yaml.safe_load(config.read_text()) == {
                "profile": "default",
                "profiles": {"default": {"registry": f"{server.host}/ml"}},
            }
            saved = json.loads((docker / "config.json").read_text())["auths"][server.host]
            assert base64.b64decode(saved["auth"]) == b"ml-bot:pa55-word"
            code, stdout, screen = on_terminal(command, env, [])
            assert code == 0 and json.loads(stdout)["built"] is False, screen
    finally:
        tokens.stop()


def on_terminal(
    command: list[str], env: dict[str, str], answers: list[tuple[str, str]], timeout: float = 60
) -> tuple[int, str, str]:
    """Run `command` with its stdin and stderr on a pseudo-terminal, typing each answer once
    its prompt shows; (exit code, stdout, what the terminal showed)."""
    import fcntl
    import select
    import termios
    import time

    def own_terminal() -> None:
        # the terminal is the process's controlling one, as in a login: a password prompt
        # reads /dev/tty, which is then this terminal and not the one of the test run
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    leader, follower = os.openpty()
    process = subprocess.Popen(
        command,
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
        preexec_fn=own_terminal,
    )
    os.close(follower)
    screen, pending = b"", list(answers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        if pending and pending[0][0].encode() in screen.rsplit(b"\n", 1)[-1]:
            # a password prompt turns echo off, and drops what was typed before: wait for it
            hidden = pending[0][0].startswith("Password")
            if not hidden or not termios.tcgetattr(leader)[3] & termios.ECHO:
                os.write(leader, pending.pop(0)[1].encode() + b"\n")
        if process.poll() is not None and not ready:
            break
    shown = screen.decode(errors="replace")
    try:  # the terminal closes a moment before the process ends
        process.wait(max(deadline - time.monotonic(), 5))
    except subprocess.TimeoutExpired:  # still waiting for something: what did it show?
        process.kill()
        process.wait(10)
        os.close(leader)
        raise AssertionError(
            f"still running after {timeout:.0f}s; the terminal showed: {shown}"
        ) from None
    stdout = process.stdout.read().decode() if process.stdout else ""
    os.close(leader)
    assert not pending, f"never asked {pending[0][0]!r}: {shown}"
    return process.returncode, stdout, shown


def test_a_base_from_another_registry_is_copied(
    registry: RegistryServer, run_environment: dict[str, str], project: Path
) -> None:
    """The base image in one registry, the project's in another: the base's layer passes
    through (streamed, not held), once."""
    from gpufleet.testing.registry import registry_binary

    binary = registry_binary()
    assert binary is not None  # the registry fixture found it
    with RegistryServer(binary) as other:
        command = [sys.executable, "-m", "gpufleet", "run", str(project), "--no-submit",
                   "-o", "json", "--registry", f"{other.host}/ml",
                   "--base-image", f"{registry.host}/base/python:3.11"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=run_environment)
        assert done.returncode == 0, done.stderr
        pushed = json.loads(done.stdout)
        assert (pushed["blobsPushed"], pushed["blobsMounted"]) == (4, 0)
        layers = manifest(other, pushed["image"])["layers"]
        base = httpx.get(
            f"http://{registry.host}/v2/base/python/manifests/3.11",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        ).json()["layers"]
        assert layers[0]["digest"] == base[0]["digest"]
        # the base's layer arrived whole: the registry checks every blob's digest
        blob = httpx.head(f"http://{other.host}/v2/ml/demo/blobs/{base[0]['digest']}")
        assert blob.status_code == 200
        assert int(blob.headers["Content-Length"]) == base[0]["size"]
        (project / "train.py").write_text("print('changed')\n")
        again = json.loads(
            subprocess.run(command, capture_output=True, text=True, env=run_environment).stdout
        )
        assert (again["blobsPushed"], again["blobsMounted"]) == (2, 0)  # code and config

"""A throwaway OCI registry for tests and benchmarks: Debian's docker-registry (the CNCF
Distribution registry), filesystem storage in a fresh folder, plain HTTP on 127.0.0.1; and a
way to put an OCI image layout (the archives `make image` writes) into it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from gpufleet.image.registry import Registry


class RegistryServerError(RuntimeError):
    pass


def registry_binary() -> str | None:
    return shutil.which("docker-registry") or shutil.which("registry")


class RegistryServer:
    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-registry-"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> RegistryServer:
        config = self.root / "config.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {
                        "filesystem": {"rootdirectory": str(self.root / "data")},
                        "delete": {"enabled": True},
                    },
                    "http": {"addr": self.host},
                }
            )
        )
        log = (self.root / "registry.log").open("wb")
        self.process = subprocess.Popen(
            [self.binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RegistryServerError(
                    f"docker-registry exited ({self.process.returncode}): "
                    + (self.root / "registry.log").read_text()[-800:]
                )
            try:
                if httpx.get(f"http://{self.host}/v2/", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RegistryServerError(f"docker-registry did not answer on {self.host} in {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def push_layout(archive: Path, registry: Registry, repository: str, tag: str) -> str:
    """Push the first image of an OCI layout archive as repository:tag; its manifest digest."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-layout-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        layout = Path(tmp)
        index = json.loads((layout / "index.json").read_text())
        descriptor = index["manifests"][0]

        def blob(digest: str) -> Path:
            return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")

        manifest = json.loads(blob(descriptor["digest"]).read_text())
        for item in [*manifest["layers"], manifest["config"]]:
            if not registry.has_blob(repository, item["digest"]):
                registry.upload(repository, item["digest"], item["size"], blob(item["digest"]))
        return registry.put_manifest(
            repository, tag, descriptor["mediaType"], blob(descriptor["digest"]).read_bytes()
        )

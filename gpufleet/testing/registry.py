"""A throwaway OCI registry for tests and benchmarks: Debian's docker-registry (the CNCF
Distribution registry), filesystem storage in a fresh folder, plain HTTP on 127.0.0.1; and a
way to put an OCI image layout (the archives `make image` writes) into it."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import secrets
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from types import TracebackType

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from gpufleet.image.registry import Registry

# the base image `make image` builds for these tests (Debian and its python3)
BASE_ARCHIVE = Path(__file__).resolve().parents[2] / "build" / "image" / "python-base.oci.tar"


class RegistryServerError(RuntimeError):
    pass


def registry_binary() -> str | None:
    return shutil.which("docker-registry") or shutil.which("registry")


class RegistryServer:
    def __init__(self, binary: str, tokens: TokenService | None = None) -> None:
        self.binary = binary
        self.tokens = tokens  # logins checked by this token service; anonymous without
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-registry-"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> RegistryServer:
        settings: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host},
        }
        if self.tokens is not None:
            bundle = self.root / "tokens.pem"
            bundle.write_bytes(self.tokens.certificate_pem())
            settings["auth"] = {
                "token": {
                    "realm": self.tokens.realm,
                    "service": self.tokens.service,
                    "issuer": self.tokens.issuer,
                    "rootcertbundle": str(bundle),
                }
            }
        config = self.root / "config.yml"
        config.write_text(json.dumps(settings))  # YAML is a superset of JSON
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
                # 401: it answers, and asks for a token
                if httpx.get(f"http://{self.host}/v2/", timeout=2).status_code in (200, 401):
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


class TokenService:
    """A token service of the registry token protocol, for tests: it checks one user's basic
    credentials and grants what each scope asks, in JWTs signed with a key of its own; the
    registry, given its certificate, verifies them (the x5c header names the certificate)."""

    def __init__(self, username: str, password: str) -> None:
        self.username, self.password = username, password
        self.issuer, self.service = "gpufleet-test-tokens", "gpufleet-test-registry"
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.issuer)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.issued = 0  # tokens given out
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.urlparse(self.path).query
                scopes = urllib.parse.parse_qs(query).get("scope", [])
                basic = base64.b64encode(f"{service.username}:{service.password}".encode())
                if self.headers.get("Authorization") != f"Basic {basic.decode()}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(scopes), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        der = self.certificate.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": self.issuer, "sub": self.username, "aud": self.service,
                  "exp": now + 300, "nbf": now - 10, "iat": now, "jti": secrets.token_hex(8),
                  "access": access}  # fmt: skip
        signing = b".".join(_b64(json.dumps(part).encode()) for part in (header, claims))
        signature = self.key.sign(signing, padding.PKCS1v15(), hashes.SHA256())
        self.issued += 1
        return (signing + b"." + _b64(signature)).decode()

    def stop(self) -> None:
        self.server.shutdown()


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")

"""Certificates for the local control plane and the controller's webhooks: a CA, serving
certificates, an admin client certificate (group system:masters) and a service-account key.

Private keys are created with mode 0600 from the first byte, in folders that only their owner
may read: a folder that exists with another owner or wider permissions is refused, never used.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=365)


class PKIError(ValueError):
    """A certificate folder cannot be used safely; the message says why and what to do."""


@dataclass(frozen=True)
class PKI:
    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.folder / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.folder / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.folder / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.folder / "admin.key"

    @property
    def etcd(self) -> PKI:
        """etcd's own CA: etcd takes no certificate of the cluster's CA (an admin's, a
        kubelet's), only the API server's client certificate of this one."""
        return PKI(self.folder / "etcd")

    @property
    def etcd_cert(self) -> Path:
        return self.etcd.folder / "server.crt"

    @property
    def etcd_key(self) -> Path:
        return self.etcd.folder / "server.key"

    @property
    def etcd_client_cert(self) -> Path:
        """The API server's certificate towards etcd."""
        return self.etcd.folder / "apiserver-client.crt"

    @property
    def etcd_client_key(self) -> Path:
        return self.etcd.folder / "apiserver-client.key"

    @property
    def sa_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.folder / "sa.pub"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def private_folder(folder: Path, owner: int | None = None) -> Path:
    """`folder`, created with mode 0700 when missing; refused when it exists and belongs to
    another user or others may read it (someone else could read or plant our keys there)."""
    owner = os.getuid() if owner is None else owner
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PKIError(f"certificate folder {folder} is not a folder; remove it or pick another")
    if info.st_uid != owner:
        raise PKIError(
            f"certificate folder {folder} belongs to user {info.st_uid}, not {owner}; "
            "use a folder of your own (--state-dir)"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise PKIError(
            f"certificate folder {folder} has mode {mode:04o}: others may read it; "
            f"run chmod 700 {folder} or use another folder"
        )
    return folder


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # a key left by an earlier run may have any mode: start from a new file opened 0600
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        parts.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(parts)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
    )


def issue_serving_cert(
    ca_cert_path: Path, ca_key_path: Path, cert_path: Path, key_path: Path, hosts: list[str]
) -> None:
    """A server certificate for `hosts` (IP addresses or DNS names), signed by the CA."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        _builder(_name(hosts[0]), ca_cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)


def create_ca(folder: Path, name: str = "gpufleet-dev-ca") -> PKI:
    """A CA (certificate and key) in a private `folder`: what a webhook needs to sign its
    serving certificate and give the API server its caBundle."""
    pki = PKI(private_folder(folder))
    ca_key = _key()
    ca_name = _name(name)
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(ca_key, pki.ca_key)
    return pki


def issue_client_cert(
    pki: PKI, cert_path: Path, key_path: Path, user: str, group: str | None = None
) -> None:
    """A client certificate for `user` (in `group`), signed by the PKI's CA."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    key = _key()
    cert = (
        _builder(_name(user, group), ca_name, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)


def create_pki(folder: Path, extra_hosts: tuple[str, ...] = ()) -> PKI:
    """Everything a local control plane needs: a CA, the API server's serving certificate (for
    loopback, the `kubernetes` Service's names and `extra_hosts`), the admin client certificate
    its kubeconfig uses, etcd's serving certificate and the API server's client certificate
    towards it, and the service-account signing key."""
    pki = create_ca(folder)
    issue_serving_cert(
        pki.ca_cert,
        pki.ca_key,
        pki.server_cert,
        pki.server_key,
        [
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            *extra_hosts,
        ],
    )
    issue_client_cert(pki, pki.admin_cert, pki.admin_key, "admin", "system:masters")
    # etcd holds every Secret: it serves TLS and takes only clients with a certificate of its
    # own CA (the API server's), not any process of the machine
    etcd = create_ca(pki.etcd.folder, "gpufleet-dev-etcd-ca")
    issue_serving_cert(
        etcd.ca_cert, etcd.ca_key, pki.etcd_cert, pki.etcd_key, ["127.0.0.1", "localhost"]
    )
    issue_client_cert(etcd, pki.etcd_client_cert, pki.etcd_client_key, "kube-apiserver-etcd")
    sa_key = _key()
    _write_key(sa_key, pki.sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki

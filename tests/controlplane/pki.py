"""A throwaway PKI for the test control plane: CA, serving cert, admin and controller-manager client certs.

For a control plane that serves Pods on a real node (``node.py``) the serving certificate
also names the addresses Pods reach it at (the ``kubernetes`` Service's IP, the node's IP),
a front-proxy CA and client certificate let the API server call aggregated APIs
(metrics-server), and :func:`client_cert` issues the node's components their identities.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    controller_manager_cert: Path
    controller_manager_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
    san_ips: Sequence[str] = (),
    san_names: Sequence[str] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    *(x509.DNSName(n) for n in san_names),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in san_ips),
                ]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


# What Pods call the API server by, besides the Service IP: the names of the kubernetes Service.
SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc.cluster.local")


def make_pki(directory: Path, serving_ips: Sequence[str] = ()) -> Pki:
    """Create every key and certificate the control plane needs under ``directory``.

    ``serving_ips``: more addresses the API server is reached at (for Pods: the kubernetes
    Service's IP and the node's); its certificate then names the Service's DNS names too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    p = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        controller_manager_cert=directory / "controller-manager.crt",
        controller_manager_key=directory / "controller-manager.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("tinct-test-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write_key(p.ca_key, ca_key)
    p.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    for cert_path, key_path, subject, server in (
        (p.serving_cert, p.serving_key, _name("kube-apiserver"), True),
        # system:masters is the group RBAC grants everything; only the harness holds it.
        (p.admin_cert, p.admin_key, _name("tinct-test-admin", "system:masters"), False),
        # The user the bootstrap RBAC policy binds to the system:kube-controller-manager role.
        (
            p.controller_manager_cert,
            p.controller_manager_key,
            _name("system:kube-controller-manager"),
            False,
        ),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        names = SERVICE_NAMES if server and serving_ips else ()
        cert = _issue(subject, key, ca_name, ca_key, server=server, san_ips=serving_ips, san_names=names)
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    # The API server's identity towards aggregated API servers (requestheader authentication).
    fp_key = ec.generate_private_key(ec.SECP256R1())
    fp_name = _name("tinct-test-front-proxy-ca")
    fp_ca = _issue(fp_name, fp_key, fp_name, fp_key, ca=True)
    p.front_proxy_ca_cert.write_bytes(fp_ca.public_bytes(serialization.Encoding.PEM))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue(_name("front-proxy-client"), client_key, fp_name, fp_key)
    _write_key(p.front_proxy_client_key, client_key)
    p.front_proxy_client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(p.sa_key, sa_key)
    p.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return p


def client_cert(pki: Pki, directory: Path, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """Issue a client certificate of the cluster CA for ``cn`` (in group ``org``): (cert, key).

    The bootstrap RBAC policy knows ``system:kube-proxy`` and ``system:kube-scheduler``; the
    Node authorizer knows ``system:node:<name>`` in ``system:nodes``.
    """
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(cn, org), key, ca.subject, ca_key)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path

"""A throwaway PKI for the test control plane.

:func:`make_pki`: the cluster CA, the API server's serving cert, the admin and
controller-manager client certs, the ServiceAccount signing key, and the aggregation
layer's front-proxy CA with the client cert the API server presents to extension API
servers (which trust requests from it, with the user in ``X-Remote-User``). For a control
plane that serves Pods on a real node (``node.py``), ``serving_ips`` adds the addresses
Pods reach it at (the ``kubernetes`` Service's IP, the node's) and the Service's names.

:func:`client_cert`: a client cert of the cluster CA, the node's components' identities.

:func:`make_keda_certs`: KEDA's own CA and the one cert its operator and metrics API server
share, as KEDA's cert rotation makes it: the operator's gRPC metrics service and the
metrics API server serve with it, and the metrics API server is the gRPC client with it.
"""

from __future__ import annotations

import dataclasses
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

    @classmethod
    def under(cls, directory: Path) -> Pki:
        """The files in ``directory``, each named after its field: ``controller_manager_key``
        is ``controller-manager.key``, ``ca_cert`` ``ca.crt``; the serving pair is the API
        server's (``apiserver.crt``)."""
        paths = {}
        for f in dataclasses.fields(cls):
            stem, _, kind = f.name.rpartition("_")
            stem = "apiserver" if stem == "serving" else stem.replace("_", "-")
            paths[f.name] = directory / f"{stem}.{'crt' if kind == 'cert' else kind}"
        return cls(**paths)


#: The front-proxy client cert's CN; the API server's --requestheader-allowed-names.
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class KedaCerts:
    """``ca.crt``, ``tls.crt``, ``tls.key`` in :attr:`directory`: the names KEDA reads from its cert dir."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key(self) -> Path:
        return self.directory / "tls.key"


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
    client: bool | None = None,
    dns_names: tuple[str, ...] = ("localhost", "kubernetes.default.svc"),
    san_ips: Sequence[str] = (),
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
        # A server cert is for serving only unless ``client`` says otherwise; any other for clients.
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        if client or (client is None and not server):
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    *(x509.DNSName(n) for n in dns_names),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in san_ips),
                ]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


# What Pods call the API server by: the names of the kubernetes Service.
SERVICE_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def make_pki(directory: Path, serving_ips: Sequence[str] = ()) -> Pki:
    """Create every key and certificate the control plane needs under ``directory``.

    ``serving_ips``: more addresses the API server is reached at (for Pods: the kubernetes
    Service's IP and the node's); its certificate then names the Service's DNS names too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    p = Pki.under(directory)
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
        if server and serving_ips:
            cert = _issue(
                subject, key, ca_name, ca_key, server=True, dns_names=SERVICE_NAMES, san_ips=serving_ips
            )
        else:
            cert = _issue(subject, key, ca_name, ca_key, server=server)
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    # The aggregation layer's own CA, apart from the cluster CA: an extension API server trusts
    # X-Remote-User only from a client cert of this CA (Kubernetes' recommended setup).
    fp_key = ec.generate_private_key(ec.SECP256R1())
    fp_name = _name("tinct-test-front-proxy-ca")
    p.front_proxy_ca_cert.write_bytes(
        _issue(fp_name, fp_key, fp_name, fp_key, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(p.front_proxy_client_key, client_key)
    p.front_proxy_client_cert.write_bytes(
        _issue(_name(FRONT_PROXY_CLIENT), client_key, fp_name, fp_key).public_bytes(
            serialization.Encoding.PEM
        )
    )

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


def make_keda_certs(directory: Path, dns_names: tuple[str, ...]) -> KedaCerts:
    """KEDA's CA and its one server-and-client cert (``dns_names`` and 127.0.0.1) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    certs = KedaCerts(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("KEDA", "KEDAORG")
    certs.ca_cert.write_bytes(
        _issue(ca_name, ca_key, ca_name, ca_key, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(certs.key, key)
    cert = _issue(_name(dns_names[0]), key, ca_name, ca_key, server=True, client=True, dns_names=dns_names)
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return certs

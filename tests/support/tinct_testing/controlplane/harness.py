"""Start a real etcd + kube-apiserver + kube-controller-manager on loopback for tests.

The API server runs with RBAC authorization and client-certificate authentication.
The harness holds an admin identity (a client certificate in ``system:masters``) and
mints kubeconfigs for ServiceAccounts through the TokenRequest API, so a test can act
with exactly the permissions a chart grants.

The controller-manager runs the controllers tinct relies on (see ``CONTROLLERS``):
garbage collection of owned objects, namespace deletion, Deployments into ReplicaSets,
HorizontalPodAutoscalers, ServiceAccounts and their tokens. There is no scheduler and no
kubelet: Pods are created but stay Pending, except on the fake Node ``kwok-node-0`` that
kwok manages (``kwok.py`` here): Pods naming it in ``spec.nodeName`` become
Running and Ready, so Deployments there get available replicas.

``ControlPlane(pods=PodNetwork(node_ip))`` is the control plane of a real node
(``node.py``): Pods reach it through the ``kubernetes`` Service, so it listens on every
address and advertises the node's, its certificate names the Service's IP and the node's,
ServiceAccount tokens are mounted (the ServiceAccount admission plugin), kubelets are
authorized by the Node authorizer, aggregated APIs (metrics-server) are reachable, and
the controller-manager also runs the controllers of Services, Nodes and volumes
(``NODE_CONTROLLERS``). The tiers without a node keep the narrower control plane.

``TINCT_TEST_KUBECONFIG`` points the tests at an existing cluster instead; then nothing
is started and teardown only deletes what the tests created.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tinct_testing.controlplane import build, kwok
from tinct_testing.controlplane.pki import FRONT_PROXY_CLIENT, Pki, make_pki
from tinct_testing.controlplane.process import ControlPlaneError, Process, Processes, http_ok, wait_ready
from tinct_testing.wait import eventually

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# The controllers the controller-manager runs; the rest (nodes, volumes, endpoints, jobs,
# certificates, ...) have nothing to act on without kubelets, or nothing tinct uses.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "deployment-controller",
    "replicaset-controller",
    "horizontal-pod-autoscaler-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
)
# With a real node: Services' EndpointSlices (kube-proxy and CoreDNS read them), slices
# mirrored from the Endpoints of Services served outside Pods, Node health (and the
# not-ready taint lifted once the kubelet reports Ready), Pods of deleted Nodes, PVC binding.
NODE_CONTROLLERS = (
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "persistentvolume-binder-controller",
)
# How often the HPA controller evaluates each HPA (Kubernetes' default is 15 s).
HPA_SYNC_PERIOD = "1s"
# The harness's Service range; the first address is the kubernetes Service's.
SERVICE_CIDR = "10.0.0.0/24"


@dataclass(frozen=True)
class PodNetwork:
    """What a control plane needs to serve Pods running on a real node (``node.py``)."""

    #: The node's address: the API server advertises it as the kubernetes Service's endpoint.
    node_ip: str
    #: The kubernetes Service's ClusterIP (the first of ``SERVICE_CIDR``).
    service_ip: str = "10.0.0.1"


def _below_ephemeral(ports: range) -> range | None:
    """``ports`` less the kernel's ephemeral ones (``ip_local_port_range``); None when that
    leaves under a thousand."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    kept = range(ports.start, min(ports.stop, low))
    return kept if len(kept) >= 1000 else None


#: Ports :func:`free_port` picks from: below Kubernetes' NodePort range (30000-32767) and the
#: kernel's ephemeral ports (32768-60999 by default); None on a machine whose ephemeral range
#: starts too low, where the kernel picks.
FREE_PORTS = _below_ephemeral(range(15000, 30000))
_given: set[int] = set()
# Not the shared generator: a test that seeds it must not make two workers pick alike.
_pick = random.SystemRandom()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed); every test helper uses this one.

    The process the port is for binds it later, and until then the port must not be the
    kernel's to give away: one from the ephemeral range can meanwhile become the local end
    of an outgoing connection (any of the suite's clients, a watch that lasts minutes), and a
    listener cannot bind a port such a connection holds -- a node's kube-proxy failed so on a
    loaded machine, its health port taken for minutes. So the port comes from
    :data:`FREE_PORTS`, below the ephemeral range, and is not given twice by one process.
    """
    if FREE_PORTS is not None:
        for _ in range(200):
            port = _pick.choice(FREE_PORTS)
            if port in _given:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _given.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(server: str, ca: Path, user: dict[str, str], name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tinct-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "tinct-test", "user": name}}],
        "current-context": name,
    }


class _Clients:
    """kubectl and ServiceAccount identities for a cluster reached through ``kubeconfig``."""

    kubeconfig: Path
    workdir: Path
    bin_dir: Path | None

    @property
    def kubectl_path(self) -> str:
        return kubectl_binary(self.bin_dir)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubectl_path, kubeconfig or self.kubeconfig, args, input=input, check=check)

    def service_account_kubeconfig(self, namespace: str, name: str, hours: int = 2) -> Path:
        return mint_service_account_kubeconfig(
            self, namespace, name, self.workdir / f"sa-{namespace}-{name}.kubeconfig", hours
        )

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Wait until each CRD (``crd/<name>``) is Established.

        Right after an apply a CRD may have no ``status.conditions`` yet, and ``kubectl
        wait`` then fails at once (``<nil> is of the type <nil>``) instead of waiting: ask
        again until the deadline.
        """

        def established() -> bool:
            proc = self.kubectl("wait", "--for=condition=Established", "--timeout=30s", *crds, check=False)
            assert proc.returncode == 0, proc.stderr.strip()
            return True

        try:
            eventually(established, timeout=timeout, what=f"CRDs {', '.join(crds)} Established")
        except AssertionError as e:
            raise ControlPlaneError(str(e)) from None


class ControlPlane(Processes, _Clients):
    """etcd + kube-apiserver + kube-controller-manager from ``build.ensure_built``'s binaries, and kwok.

    ``preapply`` manifests (CRDs, typically) are applied before the controller-manager
    starts, so its garbage collector watches their kinds from the first second instead of
    after its next 30 s discovery round. A ``bin_dir`` without ``kube-controller-manager``
    (e.g. ``KUBEBUILDER_ASSETS`` from setup-envtest) runs without controllers;
    :attr:`controllers` says which.

    kwok runs from ``kwok_bin`` (default :func:`kwok.default_binary`: built, or absent with
    ``KUBEBUILDER_ASSETS``) unless ``with_kwok=False``; :attr:`kwok_node` names its Ready Node,
    or is None when kwok does not run.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        preapply: Sequence[Path] = (),
        *,
        with_kwok: bool = True,
        kwok_bin: Path | None = None,
        pods: PodNetwork | None = None,
    ) -> None:
        self.bin_dir: Path = bin_dir or build.ensure_built()
        self.pods = pods
        self.kwok_bin = (kwok_bin or kwok.default_binary()) if with_kwok else None
        super().__init__(workdir, prefix="tinct-cp-")
        self.preapply = tuple(preapply)
        self.pki: Pki | None = None
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._etcd: Process | None = None
        self._apiserver: Process | None = None
        self._controller_manager: Process | None = None
        self._kwok: Process | None = None
        self._kwok_node: str | None = None
        self.controller_manager_url = ""
        # Seconds from starting each process until it answered healthy.
        self.ready_after: dict[str, float] = {}

    @property
    def controllers(self) -> bool:
        """Whether a kube-controller-manager runs (garbage collection, namespace deletion, ...)."""
        return self._controller_manager is not None and self._controller_manager.alive()

    @property
    def kwok_node(self) -> str | None:
        """The Node kwok manages (Pods naming it become Ready), or None when kwok does not run."""
        return self._kwok_node if self._kwok is not None and self._kwok.alive() else None

    @property
    def kwok_pid(self) -> int | None:
        return self._kwok.proc.pid if self._kwok is not None and self._kwok.alive() else None

    # -- lifecycle -------------------------------------------------------------------

    def _processes(self) -> list[Process | None]:
        return [self._kwok, self._controller_manager, self._apiserver, self._etcd]

    def _start(self, deadline: float) -> None:
        serving_ips = (self.pods.service_ip, self.pods.node_ip) if self.pods else ()
        self.pki = pki = make_pki(self.workdir / "pki", serving_ips)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._etcd = Process(
            [
                str(self.bin_dir / "etcd"),
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",  # test data only: durability buys nothing here
                "--log-level",
                "warn",
            ],
            self.workdir / "etcd.log",
        )
        self._wait("etcd", lambda: http_ok(f"{etcd_url}/health"), self._etcd, deadline)
        self.server = f"https://127.0.0.1:{api_port}"
        self._apiserver = Process(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                *(self._node_flags() if self.pods else self._no_node_flags()),
                # The aggregation layer (extension API servers such as KEDA's metrics API
                # server, controlplane/keda.py, or the node's metrics-server): requests are
                # proxied with the front-proxy client cert and the user in X-Remote-* headers.
                f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
                f"--proxy-client-key-file={pki.front_proxy_client_key}",
                f"--cert-dir={self.workdir / 'certs'}",
                "--v=1",
            ],
            self.workdir / "kube-apiserver.log",
        )
        self.kubeconfig.write_text(
            yaml.safe_dump(
                _kubeconfig(
                    self.server,
                    pki.ca_cert,
                    {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)},
                    "tinct-test-admin",
                )
            )
        )
        self._wait("kube-apiserver", self.ready, self._apiserver, deadline)
        if self.preapply:
            self._apply_before_controllers()
        # kwok gets going while the controller-manager starts; its Node is awaited last.
        kwok_started = self._start_kwok() if self.kwok_bin is not None else None
        if (self.bin_dir / "kube-controller-manager").is_file():
            self._start_controller_manager(deadline)
        if kwok_started is not None:
            self._wait_kwok_node(kwok_started, deadline)

    @staticmethod
    def _no_node_flags() -> list[str]:
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--authorization-mode=RBAC",
            # The kubernetes Service endpoint may not be loopback; tests do not use it.
            "--endpoint-reconciler-type=none",
            # Pods never run here (no kubelet). Without this plugin a Pod needs no
            # ServiceAccount to exist when it is created, so a test that makes one right
            # after its namespace does not race the ServiceAccount controller.
            "--disable-admission-plugins=ServiceAccount",
            # Aggregator routing stays off: it resolves a Service through its EndpointSlices,
            # which may not hold loopback addresses; an ExternalName Service naming localhost
            # routes there instead (controlplane/keda.py).
        ]

    def _node_flags(self) -> list[str]:
        """Flags for a control plane whose Pods run on a real node and talk to it."""
        assert self.pods is not None
        assert self.pki is not None
        pki = self.pki
        return [
            # Pods reach it through the kubernetes Service, whose endpoint is the node's IP
            # (kept by the default "lease" endpoint reconciler); tests still use 127.0.0.1.
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.pods.node_ip}",
            # Kubelets may read only what their Pods use; everyone else as RBAC says.
            "--authorization-mode=Node,RBAC",
            # Logs and exec go to the kubelet at the node's IP (its host name is loopback here).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            # Aggregated APIs (metrics.k8s.io) are called at their EndpointSlices' address
            # (the node's), not through the Service's ClusterIP.
            "--enable-aggregator-routing=true",
        ]

    def _apply_before_controllers(self) -> None:
        for manifest in self.preapply:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        crds = self.kubectl("get", "crd", "-o", "name").stdout.split()
        if crds:
            self.wait_established(*crds)

    def _start_controller_manager(self, deadline: float) -> None:
        assert self.pki is not None
        pki = self.pki
        kubeconfig = self.workdir / "controller-manager.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                _kubeconfig(
                    self.server,
                    pki.ca_cert,
                    {
                        "client-certificate": str(pki.controller_manager_cert),
                        "client-key": str(pki.controller_manager_key),
                    },
                    "system:kube-controller-manager",
                )
            )
        )
        port = free_port()
        self.controller_manager_url = f"https://127.0.0.1:{port}"
        self._controller_manager = Process(
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                # Its serving cert is the API server's: same CA, 127.0.0.1 in the SANs.
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                "--leader-elect=false",
                # Each controller acts as its own ServiceAccount with its bootstrap role.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--controllers={','.join(CONTROLLERS + (NODE_CONTROLLERS if self.pods else ()))}",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
                # A test session deletes hundreds of namespaces; client-side throttling at the
                # default 20 qps would leave them Terminating for minutes.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
            self.workdir / "kube-controller-manager.log",
        )
        self._wait(
            "kube-controller-manager",
            lambda: http_ok(f"{self.controller_manager_url}/healthz", self._ssl_context()),
            self._controller_manager,
            deadline,
        )

    def _start_kwok(self) -> float:
        assert self.kwok_bin is not None
        workdir = self.workdir / "kwok"
        workdir.mkdir(exist_ok=True)
        started = time.monotonic()
        self._kwok = Process(
            kwok.argv(self.kwok_bin, self.kubeconfig),
            self.workdir / "kwok.log",
            env=kwok.environment(workdir),
        )
        self._api("POST", "/api/v1/nodes", kwok.node_manifest())
        return started

    def _wait_kwok_node(self, started: float, deadline: float) -> None:
        assert self._kwok is not None

        def ready() -> bool:
            node = self._api("GET", f"/api/v1/nodes/{kwok.NODE}")
            return node is not None and kwok.node_ready(node)

        self._wait("kwok", ready, self._kwok, deadline)
        # From starting kwok to its Node Ready; it overlaps the controller-manager's start.
        self.ready_after["kwok"] = round(time.monotonic() - started, 2)
        self._kwok_node = kwok.NODE

    # -- readiness -------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def ready(self) -> bool:
        return http_ok(f"{self.server}/readyz", self._ssl_context())

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """One API request as the admin; the object returned, or None for 404."""
        request = urllib.request.Request(
            f"{self.server}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self._ssl_context()) as r:
                data: dict[str, Any] = json.load(r)
                return data
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise ControlPlaneError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from e

    def version(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.server}/version", timeout=5, context=self._ssl_context()) as r:
            data: dict[str, str] = json.load(r)
            return data

    def _wait(self, what: str, check: Callable[[], object], proc: Process, deadline: float) -> None:
        self.ready_after[what] = wait_ready(what, check, proc, deadline, interval=0.1)


class ExistingCluster(_Clients):
    """A cluster the user points the tests at with ``TINCT_TEST_KUBECONFIG``.

    Nothing is started there, kwok neither. ``TINCT_TEST_KWOK_NODE`` names a Node of that
    cluster on which Pods become Ready (a kwok-managed one, or a real node that can run the
    tests' images); without it :attr:`kwok_node` is None and the tests that need Ready
    Pods say so.
    """

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = Path(tempfile.mkdtemp(prefix="tinct-ext-"))
        cfg = yaml.safe_load(kubeconfig.read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        self.server = cluster["server"]
        bins = os.environ.get("KUBEBUILDER_ASSETS")
        self.bin_dir = Path(bins) if bins else None
        # A real cluster runs its controller-manager.
        self.controllers = True
        self.kwok_node: str | None = os.environ.get("TINCT_TEST_KWOK_NODE") or None

    def stop(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


Cluster = ControlPlane | ExistingCluster


def kubectl_binary(bin_dir: Path | None) -> str:
    if bin_dir is not None and (bin_dir / "kubectl").is_file():
        return str(bin_dir / "kubectl")
    found = shutil.which("kubectl")
    if found:
        return found
    return str(build.ensure_built() / "kubectl")


def run_kubectl(
    binary: str, kubeconfig: Path, args: Sequence[str], *, input: str | None, check: bool
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [binary, "--kubeconfig", str(kubeconfig), *args],
        input=input,
        text=True,
        capture_output=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc


def mint_service_account_kubeconfig(
    cluster: _Clients, namespace: str, name: str, out: Path, hours: int
) -> Path:
    """Create ServiceAccount ``namespace/name`` if needed and write a kubeconfig acting as it.

    The token comes from the TokenRequest API, the way kubelet gets one for a pod.
    """
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
    token = cluster.kubectl("create", "token", name, "-n", namespace, f"--duration={hours}h").stdout.strip()
    cfg = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"]
    cl = next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = f"system:serviceaccount:{namespace}:{name}"
    out.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cl],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {"name": user, "context": {"cluster": cl["name"], "user": user, "namespace": namespace}}
                ],
                "current-context": user,
            }
        )
    )
    out.chmod(0o600)
    return out


@contextlib.contextmanager
def cluster_from_env(preapply: Sequence[Path] = ()) -> Iterator[Cluster]:
    """The cluster tests run against: ``TINCT_TEST_KUBECONFIG``, or a fresh control plane.

    ``preapply`` goes to :class:`ControlPlane`; an existing cluster gets nothing applied.
    """
    existing = os.environ.get("TINCT_TEST_KUBECONFIG")
    if existing:
        ext = ExistingCluster(Path(existing))
        try:
            yield ext
        finally:
            ext.stop()
        return
    with ControlPlane(preapply=preapply) as cp:
        yield cp

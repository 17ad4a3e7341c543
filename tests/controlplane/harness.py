"""Start a real etcd + kube-apiserver + kube-controller-manager on loopback for tests.

The API server runs with RBAC authorization and client-certificate authentication.
The harness holds an admin identity (a client certificate in ``system:masters``) and
mints kubeconfigs for ServiceAccounts through the TokenRequest API, so a test can act
with exactly the permissions a chart grants.

The controller-manager runs the controllers tinct relies on (see ``CONTROLLERS``):
garbage collection of owned objects, namespace deletion, Deployments into ReplicaSets,
HorizontalPodAutoscalers, ServiceAccounts and their tokens. There is no scheduler and no
kubelet: Pods are created but stay Pending.

``TINCT_TEST_KUBECONFIG`` points the tests at an existing cluster instead; then nothing
is started and teardown only deletes what the tests created.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from controlplane import build
from controlplane.pki import Pki, make_pki

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
# How often the HPA controller evaluates each HPA (Kubernetes' default is 15 s).
HPA_SYNC_PERIOD = "1s"


class ControlPlaneError(RuntimeError):
    """The control plane did not start; carries the tail of the failing process' log."""

    def __init__(self, what: str, log: Path | None = None) -> None:
        self.what = what
        self.log = log
        tail = ""
        if log is not None and log.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        super().__init__(f"{what}\n--- last lines of {log} ---\n{tail}" if tail else what)


def free_port() -> int:
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


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the process that started it dies (Linux).

    atexit does not run when a test process is killed hard; this keeps etcd and the API
    server from outliving it.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    def __init__(self, argv: Sequence[str], log: Path, append: bool = False) -> None:
        self.log = log
        self._fh = log.open("ab" if append else "wb")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._fh.close()


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


class ControlPlane(_Clients):
    """etcd + kube-apiserver + kube-controller-manager from ``build.ensure_built``'s binaries.

    ``preapply`` manifests (CRDs, typically) are applied before the controller-manager
    starts, so its garbage collector watches their kinds from the first second instead of
    after its next 30 s discovery round. A ``bin_dir`` without ``kube-controller-manager``
    (e.g. ``KUBEBUILDER_ASSETS`` from setup-envtest) runs without controllers;
    :attr:`controllers` says which.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self, bin_dir: Path | None = None, workdir: Path | None = None, preapply: Sequence[Path] = ()
    ) -> None:
        self.bin_dir: Path = bin_dir or build.ensure_built()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="tinct-cp-"))
        self.preapply = tuple(preapply)
        self.pki: Pki | None = None
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._controller_manager: _Process | None = None
        self.controller_manager_url = ""
        # Seconds from starting each process until it answered healthy.
        self.ready_after: dict[str, float] = {}
        self._stopped = False

    @property
    def controllers(self) -> bool:
        """Whether a kube-controller-manager runs (garbage collection, namespace deletion, ...)."""
        return self._controller_manager is not None and self._controller_manager.alive()

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> ControlPlane:
        atexit.register(self.stop)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.pki = pki = make_pki(self.workdir / "pki")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._etcd = _Process(
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
        self._wait(lambda: self._http_ok(f"{etcd_url}/health"), self._etcd, "etcd", deadline)
        self.server = f"https://127.0.0.1:{api_port}"
        self._apiserver = _Process(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # The kubernetes Service endpoint may not be loopback; tests do not use it.
                "--endpoint-reconciler-type=none",
                # No controller-manager creates ServiceAccount tokens for pods here.
                "--disable-admission-plugins=ServiceAccount",
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
        self._wait(self.ready, self._apiserver, "kube-apiserver", deadline)
        if self.preapply:
            self._apply_before_controllers()
        if (self.bin_dir / "kube-controller-manager").is_file():
            self._start_controller_manager(deadline)

    def _apply_before_controllers(self) -> None:
        for manifest in self.preapply:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        crds = self.kubectl("get", "crd", "-o", "name").stdout.split()
        if crds:
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)

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
        self._controller_manager = _Process(
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
                f"--controllers={','.join(CONTROLLERS)}",
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
            lambda: self._http_ok(f"{self.controller_manager_url}/healthz", self._ssl_context()),
            self._controller_manager,
            "kube-controller-manager",
            deadline,
        )

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            for p in (self._controller_manager, self._apiserver, self._etcd):
                if p is not None:
                    with contextlib.suppress(OSError, subprocess.SubprocessError):
                        p.stop()
        finally:
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        procs = (self._etcd, self._apiserver, self._controller_manager)
        return [p.proc.pid for p in procs if p is not None and p.alive()]

    # -- readiness -------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _http_ok(self, url: str, ctx: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def ready(self) -> bool:
        return self._http_ok(f"{self.server}/readyz", self._ssl_context())

    def version(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.server}/version", timeout=5, context=self._ssl_context()) as r:
            data: dict[str, str] = json.load(r)
            return data

    def _wait(self, check: Any, proc: _Process, what: str, deadline: float) -> None:
        started = time.monotonic()
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ControlPlaneError(f"{what} exited with code {proc.proc.returncode}", proc.log)
            if check():
                self.ready_after[what] = round(time.monotonic() - started, 2)
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} was not ready in time", proc.log)


class ExistingCluster(_Clients):
    """A cluster the user points the tests at with ``TINCT_TEST_KUBECONFIG``."""

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

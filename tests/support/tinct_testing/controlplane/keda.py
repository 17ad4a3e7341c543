"""KEDA for real in the test control plane: its operator and metrics API server, as local processes.

Both binaries come from ``build.ensure_keda`` (built from the ``github.com/kedacore/keda/v2``
module). What KEDA ships in that module is applied as it is, read from the Go module cache:
its CRDs (``config/crd/bases``), its ServiceAccount and RBAC (``config/service_account``,
``config/rbac``, ``config/metrics-server`` roles and bindings: the operator's ClusterRole,
``system:auth-delegator`` and the authentication-reader Role for the metrics API server,
and the binding that lets the HPA controller read external metrics). Both processes act as
that ServiceAccount (``keda/keda-operator``) through a kubeconfig with a token from the
TokenRequest API, so they have exactly the rights KEDA's manifests grant.

How the pieces meet without Pods, a kubelet or kube-proxy:

- the operator serves its gRPC metrics service on loopback with a cert of KEDA's own CA
  (:func:`~tinct_testing.controlplane.pki.make_keda_certs`), which the metrics API server, its client,
  presents back (``--cert-dir`` holds ``ca.crt``, ``tls.crt``, ``tls.key``, as KEDA's
  cert rotation would write them);
- the metrics API server serves ``external.metrics.k8s.io`` on loopback, registered
  through the API server's aggregation layer (the harness gives kube-apiserver the
  front-proxy flags): the APIService ``v1beta1.external.metrics.k8s.io`` names the Service
  ``keda/keda-metrics-apiserver``, which is an ``ExternalName`` Service for ``localhost``
  with the APIService's port being the metrics API server's. The aggregator resolves such a
  Service to ``https://localhost:<port>`` and checks the serving cert against
  ``keda-metrics-apiserver.keda.svc``. (A Service with a manual EndpointSlice does not
  work: endpoint addresses may not be loopback.)

kube-controller-manager's HPA controller then reads each ScaledObject's external metric
through the API server and sets the Deployment's ``spec.replicas``.

Both processes get SIGKILL when the test process dies (``PR_SET_PDEATHSIG``, as every
harness process does). KEDA's CRDs are cluster-wide and stay until the control plane goes;
each :class:`Keda` is meant to run once per control plane (the ``keda`` session fixture).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import ControlPlane, _Clients, free_port
from tinct_testing.controlplane.pki import KedaCerts, make_keda_certs
from tinct_testing.controlplane.process import ControlPlaneError, Process, Processes, http_ok, wait_ready

NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
METRICS_SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"
CRD_NAMES = (
    "scaledobjects.keda.sh",
    "scaledjobs.keda.sh",
    "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh",
    "cloudeventsources.eventing.keda.sh",
    "clustercloudeventsources.eventing.keda.sh",
)
#: KEDA's own manifests, relative to its module source, applied as shipped.
RBAC = (
    "config/service_account/service_account.yaml",
    "config/rbac/role.yaml",
    "config/rbac/role_binding.yaml",
    "config/metrics-server/role.yaml",
    "config/metrics-server/role_binding.yaml",
)
#: Hours the ServiceAccount token of the two processes is valid.
TOKEN_HOURS = 24


class _Reading:
    """What a test reads of KEDA through the API server, wherever KEDA runs."""

    cluster: _Clients

    def apiservice(self) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "apiservice", APISERVICE, "-o", "json").stdout
        data: dict[str, Any] = json.loads(out)
        return data

    def available(self) -> bool:
        """Whether the API server reaches the metrics API server (the APIService is Available)."""
        conds = (self.apiservice().get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)

    def external_metric(self, namespace: str, metric: str, scaled_object: str) -> list[dict[str, Any]]:
        """The external metric's values as the HPA controller reads them, through the API server."""
        path = (
            f"{EXTERNAL_METRICS}/namespaces/{namespace}/{metric}"
            f"?labelSelector=scaledobject.keda.sh/name%3D{scaled_object}"
        )
        out = self.cluster.kubectl("get", "--raw", path).stdout
        items: list[dict[str, Any]] = json.loads(out).get("items", [])
        return items


class InstalledKeda(_Reading):
    """KEDA as installed in a cluster the tests are pointed at (``TINCT_TEST_KUBECONFIG``)."""

    def __init__(self, cluster: _Clients) -> None:
        self.cluster = cluster
        missing = cluster.kubectl("get", "crd", "scaledobjects.keda.sh", check=False).returncode != 0
        if missing or not self.available():
            raise ControlPlaneError(
                "the cluster the tests use has no working KEDA (CRD scaledobjects.keda.sh and an "
                f"Available APIService {APISERVICE}); install KEDA there, or unset TINCT_TEST_KUBECONFIG"
            )


class Keda(Processes, _Reading):
    """KEDA's operator and metrics API server against ``cluster``; a context manager as well.

    :attr:`ready_after` says how long each part took to be ready (seconds).
    """

    cluster: ControlPlane
    start_timeout = 180.0

    def __init__(
        self,
        cluster: ControlPlane,
        bin_dir: Path | None = None,
        source: Path | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.bin_dir = bin_dir or build.ensure_keda()
        self.source = source or build.keda_source()
        super().__init__(workdir, prefix="tinct-keda-")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs: KedaCerts | None = None
        self.kubeconfig = self.workdir / "keda.kubeconfig"
        self._operator: Process | None = None
        self._adapter: Process | None = None
        self.ready_after: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------

    def _processes(self) -> list[Process | None]:
        return [self._adapter, self._operator]

    def _start(self, deadline: float) -> None:
        started = time.monotonic()
        self._apply_manifests()
        self.cluster.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, hours=TOKEN_HOURS).replace(
            self.kubeconfig
        )
        self.certs = certs = make_keda_certs(
            self.workdir / "certs",
            (f"{METRICS_SERVICE}.{NAMESPACE}.svc", f"keda-operator.{NAMESPACE}.svc", "localhost"),
        )
        self.ready_after["manifests"] = round(time.monotonic() - started, 2)

        grpc, probe, metrics = free_port(), free_port(), free_port()
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        }
        started = time.monotonic()
        self._operator = Process(
            [
                str(self.bin_dir / "keda-operator"),
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--metrics-service-bind-address=127.0.0.1:{grpc}",
                f"--cert-dir={certs.directory}",
                # The certificates are the harness's; no Secret, no patching of the APIService.
                "--enable-cert-rotation=false",
                f"--ca-dir={certs.directory}",
                "--leader-elect=false",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
            self.workdir / "keda-operator.log",
            env=env,
        )
        self._wait(
            "keda-operator", lambda: http_ok(f"http://127.0.0.1:{probe}/readyz"), self._operator, deadline
        )
        self.ready_after["keda-operator"] = round(time.monotonic() - started, 2)

        port = free_port()
        self._register(port)
        started = time.monotonic()
        self._adapter = Process(
            [
                str(self.bin_dir / "keda-adapter"),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={certs.directory}",
                f"--tls-cert-file={certs.cert}",
                f"--tls-private-key-file={certs.key}",
                f"--client-ca-file={certs.ca_cert}",
                f"--lister-kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--metrics-service-address=127.0.0.1:{grpc}",
                # Its own /metrics listens on every interface at this port (no address flag).
                f"--port={free_port()}",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
            self.workdir / "keda-adapter.log",
            env=env,
        )
        self._wait("keda-adapter (APIService Available)", self.available, self._adapter, deadline)
        self.ready_after["keda-adapter"] = round(time.monotonic() - started, 2)

    def _apply_manifests(self) -> None:
        c = self.cluster
        c.kubectl("create", "namespace", NAMESPACE, check=False)
        crds = sorted((self.source / "config/crd/bases").glob("*.yaml"))
        if not crds:
            raise ControlPlaneError(f"no KEDA CRDs under {self.source}/config/crd/bases")
        files = [*crds, *(self.source / rel for rel in RBAC)]
        c.kubectl("apply", "--server-side", "--force-conflicts", *(a for f in files for a in ("-f", str(f))))
        c.wait_established(*(f"crd/{n}" for n in CRD_NAMES), timeout=60)

    def _register(self, port: int) -> None:
        """The ExternalName Service for localhost and the APIService naming it, at ``port``."""
        assert self.certs is not None
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "service": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "port": port},
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "caBundle": base64.b64encode(self.certs.ca_cert.read_bytes()).decode(),
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs)
        )

    @property
    def logs(self) -> dict[str, Path]:
        return {p.log.name: p.log for p in (self._operator, self._adapter) if p is not None}

    def _wait(self, what: str, check: Callable[[], object], proc: Process, deadline: float) -> None:
        wait_ready(what, check, proc, deadline, ignoring=(subprocess.CalledProcessError, ValueError))


__all__ = ["APISERVICE", "CRD_NAMES", "NAMESPACE", "InstalledKeda", "Keda"]

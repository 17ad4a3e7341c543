"""Shared fixtures: the real control plane, the CRDs, a namespace per test, Prometheus, helm, KEDA.

Tests under ``tests/k8s/`` are marked ``k8s`` automatically; they run against the
kube-apiserver + etcd + kube-controller-manager that ``tests/controlplane`` builds and
starts (or the cluster ``TINCT_TEST_KUBECONFIG`` names). If the control plane cannot
start, those tests error: they are never skipped silently.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import build
from controlplane.environ import patched_environ
from controlplane.harness import Cluster, ControlPlane, cluster_from_env
from controlplane.helm import Helm
from controlplane.keda import InstalledKeda, Keda
from controlplane.prometheus import Prometheus
from router_fakes import FakeScheduler

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"
CRD_NAMES = ("modelversions.tinct.io", "grayreleases.tinct.io")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    k8s_dir = Path(__file__).parent / "k8s"
    for item in items:
        if k8s_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running control plane; ``KUBECONFIG`` points at its admin kubeconfig meanwhile."""
    # The CRDs go in before the controller-manager starts, so garbage collection of objects
    # owned by tinct's resources works from the first test.
    with cluster_from_env(preapply=[CRDS]) as c, patched_environ(KUBECONFIG=str(c.kubeconfig)):
        yield c


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> tuple[str, ...]:
    """The CRDs from ``crds/``, applied as a user would and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_established(*(f"crd/{n}" for n in CRD_NAMES))
    return CRD_NAMES


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        # The namespace controller finishes the deletion in the background; not waiting keeps
        # each test short, and the name is unique.
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The Prometheus binary built from its Go module (cached)."""
    return build.ensure_prometheus()


@pytest.fixture
def prometheus(prometheus_bin: Path, tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """A factory of started Prometheus servers, all stopped and removed at the end of the test.

    ``prom = prometheus()`` starts one on a free port (scrape and evaluation every 1 s);
    ``prom.set_targets(["127.0.0.1:9100"], {"fleet": "edge"}, wait=True)``,
    ``prom.query("up")``, ``prom.stop()`` / ``prom.start()`` (same port and data),
    ``prom.url``. Target labels named like the router's metric labels (``release``,
    ``side``, ...) would override them: pick other names.
    """
    started: list[Prometheus] = []

    def make(**options: Any) -> Prometheus:
        prom = Prometheus(prometheus_bin, tmp_path / f"prometheus-{len(started)}", **options)
        started.append(prom)
        return prom.start()

    yield make
    for prom in started:
        prom.close()


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """The helm binary built from its Go module (cached)."""
    return build.ensure_helm()


@pytest.fixture(scope="session")
def helm(helm_bin: Path, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """Run helm as the cluster admin: ``helm("install", "r", chart_dir, "-n", ns)``.

    ``kubeconfig=`` on a call acts as someone else (e.g. a ServiceAccount kubeconfig).
    """
    return Helm(helm_bin, tmp_path_factory.mktemp("helm-home"), cluster.kubeconfig)


@pytest.fixture(scope="session")
def keda(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keda | InstalledKeda]:
    """KEDA's operator and metrics API server (built from its Go module, cached), started the
    first time a test of the session asks for them; their CRDs stay until the control plane
    goes. Against ``TINCT_TEST_KUBECONFIG``, the KEDA installed there (or an error saying
    there is none)."""
    if not isinstance(cluster, ControlPlane):
        yield InstalledKeda(cluster)
        return
    with Keda(cluster, workdir=tmp_path_factory.mktemp("keda")) as k:
        print(f"KEDA ready after {k.ready_after} s")
        yield k


@pytest.fixture
async def v1() -> AsyncIterator[FakeScheduler]:
    """The stable scheduler stand-in, a real HTTP server on 127.0.0.1."""
    s = await FakeScheduler("v1").start()
    yield s
    await s.stop()


@pytest.fixture
async def v2() -> AsyncIterator[FakeScheduler]:
    """The candidate scheduler stand-in."""
    s = await FakeScheduler("v2").start()
    yield s
    await s.stop()


@pytest.fixture
def backends(v1: FakeScheduler, v2: FakeScheduler) -> tuple[FakeScheduler, FakeScheduler]:
    return v1, v2

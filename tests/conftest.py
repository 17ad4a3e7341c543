"""Shared fixtures: the real control plane, the CRDs, a namespace per test.

Tests under ``tests/k8s/`` are marked ``k8s`` automatically; they run against the
kube-apiserver + etcd that ``tests/controlplane`` builds and starts (or the cluster
``TINCT_TEST_KUBECONFIG`` names). If the control plane cannot start, those tests error:
they are never skipped silently.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.environ import patched_environ
from controlplane.harness import Cluster, cluster_from_env
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
    with cluster_from_env() as c, patched_environ(KUBECONFIG=str(c.kubeconfig)):
        yield c


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> tuple[str, ...]:
    """The CRDs from ``crds/``, applied as a user would and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in CRD_NAMES])
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
        # Without a controller-manager the namespace stays Terminating; its name is unique.
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


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

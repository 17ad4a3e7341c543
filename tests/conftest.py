"""Shared fixtures: the real control plane, the CRDs, a namespace per test, Prometheus, helm, KEDA.

Tests under ``tests/integration/`` are marked ``integration``: they need no cluster, but each
starts processes (router workers under load, the CLI in a child, writers on the S3 server, a
fresh virtualenv) and takes seconds; ``make unit`` leaves them to ``make test``.

Tests under ``tests/k8s/`` are marked ``k8s`` automatically; they run against the
kube-apiserver + etcd + kube-controller-manager that ``tinct_testing.controlplane`` builds and
starts (or the cluster ``TINCT_TEST_KUBECONFIG`` names). If the control plane cannot
start, those tests error: they are never skipped silently.

Tests under ``tests/e2e/`` are marked ``e2e``: they run the chart, from the image built
here, on a real node (``tinct_testing.controlplane.node``; fixtures ``node``, ``node_cluster``,
``node_helm``, ``node_prometheus``, ``tinct_image``). That node has a control plane of its
own: one that serves Pods differs from the ``k8s`` tier's on purpose -- there Pods stay
Pending, or become Ready on kwok's fake node, without a scheduler, and a Pod made right
after its namespace must not race the ServiceAccount controller -- so each tier keeps
its own, each started at most once per session and only when a test of that tier runs.
The tier needs root and Debian packages (``scripts/bootstrap.sh`` installs them); without
them its tests fail saying what is missing.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane import build, images
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.harness import Cluster, ControlPlane, cluster_from_env, free_port
from tinct_testing.controlplane.helm import Helm
from tinct_testing.controlplane.keda import InstalledKeda, Keda
from tinct_testing.controlplane.node import Node, NodeParts, ensure_parts
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.lineage_artifacts import S3, moto_process, s3_client
from tinct_testing.paths import CRD_NAMES, CRDS
from tinct_testing.release_cluster import STATUS_KEY
from tinct_testing.router_fakes import FakeScheduler


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        parents = Path(str(item.fspath)).parents
        if here / "integration" in parents:
            item.add_marker(pytest.mark.integration)
        elif here / "k8s" in parents:
            item.add_marker(pytest.mark.k8s)
        elif here / "e2e" in parents:
            item.add_marker(pytest.mark.e2e)
    if _xdist_worker(config):
        # The node tier is the longest run of one worker: it starts first, building its
        # parts (on a cold machine) while the other workers run the rest.
        items.sort(key=lambda item: item.get_closest_marker("e2e") is None)
    else:
        # In one process the e2e tier runs last, so that on a cold machine its node's parts
        # and images build while the other tiers run (pytest_collection_finish starts that).
        items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``make test``), each test goes to whichever worker is free, except the
    e2e tier, which runs whole in one worker: there is one node per machine, and the worker
    that started it keeps it for the rest of its session."""
    from xdist.scheduler import LoadScopeScheduling

    class _OneNode(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid

    return _OneNode(config, log)


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that reports the run (one process, or xdist's controller; never a worker,
    whose controller waits for it) ends once everything is reported and the atexit handlers
    ran, without the interpreter's own teardown: a run whose tests all passed once died there
    with SIGABRT (a native library's thread woken while the interpreter finalised), and the
    run's status is the tests', not that."""
    if _xdist_worker(config) or _EXIT_STATUS not in config.stash:
        return
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash[_EXIT_STATUS])


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under xdist every worker collects every test; only the one given the node tier builds it
    # (the node fixture starts the build where it is first used).
    if _xdist_worker(session.config) or session.config.option.collectonly:
        return
    if any(i.get_closest_marker("e2e") for i in session.items):
        _NODE_BUILD.start()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running control plane; ``KUBECONFIG`` points at its admin kubeconfig meanwhile."""
    # The CRDs go in before the controller-manager starts, so garbage collection of objects
    # owned by tinct's resources works from the first test.
    with (
        cluster_from_env(preapply=[CRDS]) as c,
        patched_environ(KUBECONFIG=str(c.kubeconfig), TINCT_STATUS_KEY=STATUS_KEY),
    ):
        yield c


@pytest.fixture
def own_control_plane() -> None:
    """For a test that starts a control plane of its own: not against ``TINCT_TEST_KUBECONFIG``."""
    if os.environ.get("TINCT_TEST_KUBECONFIG"):
        pytest.fail("this test starts its own control plane; unset TINCT_TEST_KUBECONFIG")


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> tuple[str, ...]:
    """The CRDs from ``crds/``, applied as a user would and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_established(*(f"crd/{n}" for n in CRD_NAMES))
    return CRD_NAMES


@pytest.fixture
def namespace(cluster: Cluster, crds: tuple[str, ...], request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards; tinct's CRDs are Established."""
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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """An S3 server (:func:`moto_process`); the AWS SDK environment points at it for the session."""
    with (
        moto_process(free_port()) as endpoint,
        patched_environ(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
        ),
    ):
        yield endpoint


@pytest.fixture
def s3(s3_server: str) -> S3:
    return S3(endpoint=s3_server, client=s3_client(s3_server))


# -- the end-to-end tier's node ---------------------------------------------------------


class _Background:
    """The e2e node's parts and the tinct image, built in a thread from the session's start.

    Cold, that is many minutes of go builds, debootstrap and pip; the other tiers run
    meanwhile, and the image builds beside the Go parts (the one waits on the network as
    much as the other on the CPU). A daemon thread: a session that ends early does not wait.
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: tuple[NodeParts, images.Image] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                image = pool.submit(images.ensure_image, False)
                parts = ensure_parts(verbose=False)
                self._result = (parts, image.result())
        except BaseException as e:
            self._error = e
        finally:
            self._done.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="e2e-node-build", daemon=True)
            self._thread.start()

    def result(self) -> tuple[NodeParts, images.Image]:
        self.start()
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


_NODE_BUILD = _Background()


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    """A real node with its control plane, the tinct image imported; torn down at the end."""
    parts, tinct = _NODE_BUILD.result()
    n = Node([tinct], parts=parts).start()
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="session")
def tinct_image(node: Node) -> images.Image:
    """The image built from the Dockerfile on the local Python base, in the node's containerd."""
    return node.images[-1]


@pytest.fixture(scope="session")
def node_cluster(node: Node) -> ControlPlane:
    return node.cluster


@pytest.fixture(scope="session")
def node_helm(helm_bin: Path, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm as the node cluster's admin."""
    return Helm(helm_bin, tmp_path_factory.mktemp("node-helm-home"), node.cluster.kubeconfig)


@pytest.fixture(scope="session")
def node_prometheus(
    prometheus_bin: Path, node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """A Prometheus listening on the node's address, so that Pods (the operator) can query it."""
    prom = Prometheus(prometheus_bin, tmp_path_factory.mktemp("node-prometheus"), host=node.ip).start()
    try:
        yield prom
    finally:
        prom.close()

"""Cluster-side helpers of the GrayRelease tests: the objects a release needs, waiting on it,
running the operator in-process, reading its history."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kopf.testing import KopfRunner
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes import watch as kube_watch

from tinct.api.routing import DATA_KEY, VERSION_ANNOTATION, configmap_name
from tinct.lineage.sql import query
from tinct_testing.controlplane import kwok
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lineage_artifacts import make_onnx, sha256_file
from tinct_testing.modelversion_cluster import get_object as get
from tinct_testing.modelversion_cluster import mv_doc
from tinct_testing.release_helpers import example as example  # the cluster tests' release
from tinct_testing.wait import WAIT, eventually

MODULES = ["-m", "tinct.operator.modelversion", "-m", "tinct.operator.grayrelease.handler"]
#: Where the tests' schedulers listen: a backend tables may name only by the allow-list.
LOOPBACK = "127.0.0.1"
#: The key every operator of the session seals GrayRelease statuses with, as the chart's
#: Secret gives one to every replica: a replica taking over, or an operator restarted,
#: verifies what the one before wrote (the ``cluster`` fixture sets ``TINCT_STATUS_KEY``).
STATUS_KEY = "tinct-tests-status-key"


def apply(cluster: Cluster, ns: str, *docs: dict[str, Any]) -> str:
    """``kubectl apply`` of ``docs`` in ``ns``: what it printed."""
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs)).stdout


def release_status(cluster: Cluster, ns: str, name: str = "chat") -> dict[str, Any]:
    obj = get(cluster, ns, "grayrelease", name) or {}
    st: dict[str, Any] = obj.get("status") or {}
    return st


def wait_release(
    cluster: Cluster,
    ns: str,
    pred: Callable[[dict[str, Any]], bool],
    what: str,
    name: str = "chat",
    timeout: float = WAIT,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = release_status(cluster, ns, name)
        return st if st and pred(st) else None

    st: dict[str, Any] = eventually(check, timeout=timeout, what=what)
    return st


def in_phase(
    cluster: Cluster, ns: str, phase: str, *, name: str = "chat", timeout: float = WAIT
) -> dict[str, Any]:
    """Release ``name``'s status once its phase is ``phase``."""
    return wait_release(cluster, ns, lambda s: s.get("phase") == phase, f"{name} {phase}", name, timeout)


def wait_history_written(cluster: Cluster, ns: str, name: str = "chat") -> None:
    """Wait, with the operator still running, until its lineage holds every recorded transition.

    The operator records a transition in status first and writes its history row after the
    round acts; status keeps the transition until the row is written. Stopping the operator as
    soon as status shows a phase can leave the last row for its next run.
    """
    eventually(
        lambda: not release_status(cluster, ns, name).get("history"),
        timeout=WAIT,
        what=f"{name}'s transitions written to lineage (status.history drained)",
    )


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def modelversion(
    name: str, version: str, onnx: Path, *, wrong_digest: bool = False, model: str = "llama3-8b"
) -> dict[str, Any]:
    digest = "0" * 64 if wrong_digest else sha256_file(onnx)
    return mv_doc(
        name, [{"format": "onnx", "uri": onnx.as_uri(), "sha256": digest}], version=version, model=model
    )


def service(name: str, port: int = 8000, target: int | str = 8000) -> dict[str, Any]:
    """Service ``name`` of the Pods labelled ``app: name``: ``port`` to their ``target``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target}]},
    }


def deployment(name: str, replicas: int = 1, ready: bool = True, *, node: str = kwok.NODE) -> dict[str, Any]:
    """A Deployment of the scheduler image (never pulled: nothing runs containers here).

    ``ready``: its Pods name ``node`` (the harness's kwok Node; an existing cluster's is
    :func:`ready_node`), where they become Running and Ready and count as available.
    Otherwise they name no node and stay Pending (no scheduler runs).
    """
    pod: dict[str, Any] = {"containers": [{"name": "scheduler", "image": "registry.invalid/scheduler:1"}]}
    if ready:
        pod.update(kwok.placement(node))
    return workload(name, replicas, pod)


def workload(name: str, replicas: int, pod: dict[str, Any]) -> dict[str, Any]:
    """A Deployment ``name`` of ``replicas`` Pods of spec ``pod``, labelled and selected ``app: name``."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def cpu_hpa(name: str, target: str, min_replicas: int, max_replicas: int, utilization: int) -> dict[str, Any]:
    """A HorizontalPodAutoscaler of Deployment ``target`` on CPU utilization."""
    cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": utilization}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "Resource", "resource": cpu}],
        },
    }


def ready_node(cluster: Cluster) -> str:
    """The Node on which this cluster's Pods become Ready; fails saying why there is none."""
    if cluster.kwok_node is None:
        raise AssertionError(
            "no Node here makes Pods Ready: the harness runs kwok unless KUBEBUILDER_ASSETS names "
            "a directory without a kwok binary; with TINCT_TEST_KUBECONFIG set "
            "TINCT_TEST_KWOK_NODE to a Node of that cluster whose Pods run"
        )
    return cluster.kwok_node


def wait_available(cluster: Cluster, ns: str, name: str, n: int, timeout: float = WAIT) -> dict[str, Any]:
    """Deployment ``ns/name`` once it has exactly ``n`` available replicas, all of its current spec.

    Fails at once when no Node makes Pods Ready (:func:`ready_node`); on timeout the
    message lists the Deployment's status and its Pods' phases and nodes.
    """
    ready_node(cluster)

    def available() -> dict[str, Any] | None:
        dep = get(cluster, ns, "deployment", name)
        assert dep is not None, f"Deployment {ns}/{name} does not exist"
        st = dep.get("status") or {}
        if (
            st.get("observedGeneration") == dep["metadata"]["generation"]
            and st.get("availableReplicas", 0) == n
            and st.get("updatedReplicas", 0) == n
            and st.get("replicas", 0) == n
        ):
            return dep
        return None

    def pods() -> str:
        dep = get(cluster, ns, "deployment", name)
        if dep is None:
            return f"Deployment {ns}/{name} does not exist"
        labels = dep["spec"]["selector"].get("matchLabels", {})
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json", check=False).stdout
        found = [
            (p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"))
            for p in json.loads(out or "{}").get("items", [])
        ]
        return f"status {dep.get('status')}; pods (name, phase, node) {found}"

    dep: dict[str, Any] = eventually(
        available, timeout=timeout, what=f"Deployment {ns}/{name} with {n} available replicas", explain=pods
    )
    return dep


def backends(
    cluster: Cluster,
    ns: str,
    tmp: Path,
    *,
    candidate_version: str = "1.5.0",
    stable_replicas: int = 1,
    candidate_ready: bool = True,
    **kw: Any,
) -> Path:
    """Services, Deployments and the two ModelVersions of examples/grayrelease.yaml; returns
    the ONNX file both ModelVersions name. ``candidate_ready=False``: the candidate's Pods
    never become Ready."""
    onnx = make_onnx(tmp / "model.onnx")
    apply(
        cluster,
        ns,
        service("sched-v1"),
        service("sched-v2"),
        deployment("sched-v1", replicas=stable_replicas),
        deployment("sched-v2", ready=candidate_ready),
        modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
        modelversion("llama3-8b-2-0-0", candidate_version, onnx, **kw),
    )
    return onnx


def table(
    cluster: Cluster, ns: str, release: str = "chat", tables: str | None = None
) -> tuple[int, dict[str, Any]] | None:
    """(version, document) of ``ns/release``'s routing table in the table namespace ``tables``
    (default ``ns``), or None."""
    cm = get(cluster, tables or ns, "configmap", configmap_name(ns, release))
    if cm is None:
        return None
    return int(cm["metadata"]["annotations"][VERSION_ANNOTATION]), json.loads(cm["data"][DATA_KEY])


def weights(
    cluster: Cluster, ns: str, release: str = "chat", tables: str | None = None
) -> list[float] | None:
    got = table(cluster, ns, release, tables)
    return None if got is None else [c["weight"] for c in got[1]["cells"]]


@contextmanager
def operator(ns: str, root: Path, **env: str) -> Iterator[KopfRunner]:
    """The operator on ``ns``, lineage under ``root``; it may read artifacts beside ``root``.
    Its routing tables go to ``ns`` unless ``TINCT_TABLE_NAMESPACE`` says otherwise."""
    env.setdefault("TINCT_ARTIFACT_ROOTS", str(root.parent))
    env.setdefault("TINCT_TABLE_NAMESPACE", ns)
    # The tests' schedulers listen on loopback, outside any namespace: allowed by name.
    env.setdefault("TINCT_ALLOW_BACKENDS", LOOPBACK)
    with patched_environ(TINCT_LINEAGE_ROOT=str(root), TINCT_RELEASE_TICK="0.5", **env):
        with KopfRunner(["run", *MODULES, "--standalone", "--namespace", ns], timeout=60) as runner:
            yield runner
        assert runner.exception is None, runner.output
        assert runner.exit_code == 0, runner.output


@dataclass(frozen=True)
class Started:
    """A release :func:`started`: the ONNX file its ModelVersions name, the status awaited."""

    onnx: Path
    status: dict[str, Any]


@contextmanager
def started(cluster: Cluster, ns: str, tmp: Path, doc: dict[str, Any], **fields: Any) -> Iterator[Started]:
    """Release ``doc`` in ``ns`` over :func:`backends`, with the operator running (lineage under
    ``tmp/lineage``) for the block, from when its status has ``fields`` (``phase="Promoted"``)."""
    onnx = backends(cluster, ns, tmp)
    with operator(ns, tmp / "lineage"):
        apply(cluster, ns, doc)
        what = ", ".join(f"{k} {v}" for k, v in fields.items())
        st = wait_release(
            cluster, ns, lambda s: fields.items() <= s.items(), what, name=doc["metadata"]["name"]
        )
        yield Started(onnx, st)


def history(root: Path, release: str = "chat") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = query(
        f"SELECT event_id, step, state, reason, weights, metrics FROM release_events "
        f"WHERE release = '{release}' ORDER BY recorded_at, event_id",
        str(root),
    ).to_pylist()
    return rows


#: (state, step) of each history row of the shipped example stepped to its end: it starts,
#: steps twice and is promoted (``step`` counts from 1, as ``2/4`` reads).
#: An analysis without metrics whose steps move on every 2 s.
NO_METRICS = {"interval": "2s", "metrics": []}
#: An analysis without metrics that holds a release at its step for an hour (longer than any test).
HOLD = {"interval": "1h", "metrics": []}

PROMOTED_PATH = [("Progressing", 1), ("Progressing", 2), ("Progressing", 3), ("Promoted", 4)]


def path(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(state, step) of each of :func:`history`'s ``rows``."""
    return [(r["state"], r["step"]) for r in rows]


def events(
    cluster: Cluster, ns: str, kind: str = "GrayRelease", reason: str | None = None
) -> list[dict[str, Any]]:
    """The Events in ``ns`` about objects of ``kind`` (any kind: ``""``), of ``reason`` if given."""
    fields = ",".join(f"{k}={v}" for k, v in (("involvedObject.kind", kind), ("reason", reason)) if v)
    out = cluster.kubectl("get", "events", "-n", ns, "--field-selector", fields, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out).get("items", [])
    return items


class Versions:
    """Every version of one object the API server commits, in commit order, from a watch.

    Sampling two objects with GETs cannot order their changes (a Deployment's status can
    even step back for a moment while the controller's caches catch up); this records each
    version with its resourceVersion, an etcd revision: one etcd orders all of them, so
    "the Deployment had 2 available replicas before the table sent 60 %" is a comparison.
    """

    def __init__(self, cluster: Cluster, ns: str, kind: str, name: str) -> None:
        self.api = kube_config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self._args: tuple[str, ...] = (ns,)
        self._list: Callable[..., Any]
        if kind == "deployment":
            self._list = kube_client.AppsV1Api(self.api).list_namespaced_deployment
        elif kind == "configmap":
            self._list = kube_client.CoreV1Api(self.api).list_namespaced_config_map
        elif kind == "grayrelease":
            self._list = kube_client.CustomObjectsApi(self.api).list_namespaced_custom_object
            self._args = ("tinct.io", "v1alpha1", ns, "grayreleases")
        else:
            raise ValueError(kind)
        self.ns, self.name = ns, name
        self.seen: list[tuple[int, dict[str, Any]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"versions-{name}", daemon=True)

    def __enter__(self) -> Versions:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(15)
        self.api.close()

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            w = kube_watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    self._list,
                    *self._args,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=rv,
                    timeout_seconds=2,
                    allow_watch_bookmarks=False,
                ):
                    obj = self.api.sanitize_for_serialization(ev["object"])
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.seen.append((int(rv), obj))
                    if self._stop.is_set():
                        break
            except Exception as exc:  # reconnects from the last version seen, or lists again
                if getattr(exc, "status", None) == 410:
                    rv = None
                self.errors.append(repr(exc))
                self._stop.wait(0.2)  # a pause before reconnecting
            finally:
                w.stop()  # type: ignore[no-untyped-call]

    def first(self, pred: Callable[[dict[str, Any]], bool]) -> int | None:
        """The resourceVersion of the first version for which ``pred`` holds, or None."""
        return next((rv for rv, obj in self.seen if pred(obj)), None)

    def before(self, rv: int) -> dict[str, Any] | None:
        """The version in force just before resourceVersion ``rv`` was committed, or None."""
        got = [obj for seen, obj in self.seen if seen < rv]
        return got[-1] if got else None

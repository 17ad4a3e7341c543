"""The chart's RBAC, proven: the operator and the router run with the tokens of the
ServiceAccounts the chart creates, do their whole job, and are refused everything else.

The harness mints a kubeconfig per ServiceAccount through the TokenRequest API (the way a
kubelet gets a Pod's token), so every request below is authorized by exactly the Roles and
ClusterRoles `helm install` created.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tinct.api.routing import DATA_KEY, routing_configmap
from tinct.router.watch import EVENT_REASON
from tinct_testing import router_fakes as fakes
from tinct_testing.chart_helpers import CHART
from tinct_testing.commands import TINCT, router_argv
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.controlplane.helm import Helm
from tinct_testing.controlplane.process import spawned
from tinct_testing.lineage_artifacts import make_onnx, make_ptx, sha256_file
from tinct_testing.release_cluster import events
from tinct_testing.release_traffic import complete
from tinct_testing.wait import eventually, eventually_async

WAIT = 120.0  # an upper bound, never a measured figure


def _tail(log: Path) -> str:
    return log.read_text()[-4000:] if log.exists() else ""


def _install(helm: Helm, rel: str, namespace: str, *values: str, namespaced: bool = False) -> None:
    """The chart as release ``rel`` in ``namespace``; ``namespaced``: watching that namespace only."""
    if namespaced:
        values = ("--set", "scope=namespaced", "--set-json", f'watchNamespaces=["{namespace}"]', *values)
    helm("install", rel, str(CHART), "--namespace", namespace, *values)


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    if proc.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def _refused(cluster: Cluster, kubeconfig: Path, *args: str) -> str:
    """Run kubectl as the ServiceAccount and require the API server to refuse it."""
    proc = cluster.kubectl(*args, kubeconfig=kubeconfig, check=False)
    assert proc.returncode != 0, f"kubectl {' '.join(args)} was allowed:\n{proc.stdout}"
    assert "Forbidden" in proc.stderr or "forbidden" in proc.stderr, proc.stderr
    return proc.stderr


def _allowed(cluster: Cluster, kubeconfig: Path, *args: str) -> str:
    proc = cluster.kubectl(*args, kubeconfig=kubeconfig, check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} was refused:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def other_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    name = f"other-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "configmap", "elsewhere", "-n", name, "--from-literal=k=v")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextmanager
def _operator_process(
    kubeconfig: Path, lineage: Path, log: Path, *args: str, peering: str = "tinct", tables: str = "default"
) -> Iterator[None]:
    """``tinct operator`` as the chart runs it, acting as the chart's operator ServiceAccount,
    its routing tables in ``tables`` (the chart's namespace, as the chart sets it)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "TINCT_TABLE_NAMESPACE": tables,
        "TINCT_PROGRESS_INTERVAL": "0.5",
        # What the chart's artifactRoots set: file:// artifacts are read only below these.
        "TINCT_ARTIFACT_ROOTS": str(lineage.parent),
        # What the chart's allowBackends set: the tests' schedulers listen on loopback.
        "TINCT_ALLOW_BACKENDS": "127.0.0.1",
    }
    argv = [*TINCT, "operator", f"--peering={peering}", f"--lineage-root={lineage}", *args]
    with spawned(argv, log, env, grace=30) as proc:
        yield
        assert proc.poll() is None, f"the operator exited:\n{log.read_text()[-4000:]}"


def _modelversion(name: str, tmp: Path) -> tuple[dict[str, Any], Path]:
    onnx = make_onnx(tmp / f"{name}.onnx")
    ptx = make_ptx(tmp / f"{name}.ptx")
    doc = {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {
            "model": "llama3-8b",
            "version": "1.0.0",
            "artifacts": [{"format": "onnx", "uri": onnx.as_uri()}, {"format": "ptx", "uri": ptx.as_uri()}],
        },
    }
    return doc, onnx


def _ready(cluster: Cluster, namespace: str, name: str, log: Path) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = _json(cluster.kubectl("get", "modelversion", name, "-n", namespace, "-o", "json", check=False))
        phase = ((obj or {}).get("status") or {}).get("phase")
        return obj if phase in ("Ready", "Failed") else None

    obj: dict[str, Any] = eventually(
        check, timeout=WAIT, what=f"{namespace}/{name} Ready", explain=lambda: _tail(log)
    )
    assert obj["status"]["phase"] == "Ready", obj["status"]
    return obj


def _refusals_common(cluster: Cluster, kc: Path, namespace: str) -> None:
    _refused(cluster, kc, "get", "secrets", "-n", namespace)
    _refused(cluster, kc, "get", "secret", "any", "-n", namespace)
    _refused(cluster, kc, "delete", "crd", "modelversions.tinct.io", "--dry-run=server")
    _refused(cluster, kc, "create", "clusterrolebinding", "x", "--clusterrole=cluster-admin", "--user=me")
    _refused(cluster, kc, "delete", "deployment", "any", "-n", namespace, "--dry-run=server")


async def test_namespaced_identities_do_their_job_and_nothing_else(
    helm: Helm,
    cluster: Cluster,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
    backends: tuple[fakes.FakeScheduler, fakes.FakeScheduler],
) -> None:
    rel = f"rbac-{namespace[-6:]}"
    _install(helm, rel, namespace, namespaced=True)
    op_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-operator")
    rt_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-router")

    # The operator: peering on, as the chart's Deployment runs it; a ModelVersion to Ready.
    log = tmp_path / "operator.log"
    doc, onnx = _modelversion("llama-1-0-0", tmp_path)
    with _operator_process(op_kc, tmp_path / "lineage", log, f"--namespace={namespace}", tables=namespace):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
        obj = _ready(cluster, namespace, "llama-1-0-0", log)
        assert obj["status"]["digests"]["onnx"] == sha256_file(onnx)
        assert "tinct.io/finalizer" in obj["metadata"]["finalizers"]
        peering = _json(cluster.kubectl("get", "kopfpeering", "tinct", "-n", namespace, "-o", "json"))
        assert (peering or {}).get("status"), "the replica announced itself in the peering"
        assert events(cluster, namespace, "", "Verified"), "the operator posted its Event"

        # Out of scope: the same kind in another namespace is neither seen nor touched.
        cluster.kubectl("apply", "-n", other_namespace, "-f", "-", input=json.dumps(doc))
        time.sleep(3)  # time an operator that saw it would need to act on it
        stray = _json(cluster.kubectl("get", "mv", "llama-1-0-0", "-n", other_namespace, "-o", "json"))
        assert stray is not None
        assert not stray.get("status"), "the operator acted outside its namespace"
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "Not enough permissions" not in text, "kopf lacked a permission it looks for"
    assert "APIForbiddenError" not in text, text[-4000:]

    _refusals_common(cluster, op_kc, namespace)
    _refused(cluster, op_kc, "get", "modelversions", "-n", other_namespace)
    _refused(cluster, op_kc, "get", "configmaps", "-n", other_namespace)
    _refused(cluster, op_kc, "get", "namespace", namespace)  # may list them, never read one
    _refused(cluster, op_kc, "delete", "namespace", other_namespace, "--dry-run=server")
    _refused(cluster, op_kc, "delete", "modelversion", "llama-1-0-0", "-n", namespace, "--dry-run=server")
    _refused(cluster, op_kc, "scale", "deployment", f"{rel}-tinct-router", "-n", namespace, "--replicas=5")

    # The router: follows routing tables in its namespace, reports a bad one with an Event.
    v1, v2 = backends
    async with fakes.watching_router(namespace, rt_kc) as (base, holder, http):
        await fakes.publish(
            cluster, namespace, holder, fakes.table(v1.url, v2.url, version=1, default_weight=0)
        )
        assert await fakes.side(http, base) == "v1"
        await fakes.publish(
            cluster, namespace, holder, fakes.table(v1.url, v2.url, version=2, default_weight=100)
        )
        assert await fakes.side(http, base) == "v2"
        bad = routing_configmap(fakes.table(v1.url, v2.url, version=3))
        bad["data"][DATA_KEY] = "{not json"
        fakes.apply_table(cluster, namespace, bad)
        await eventually_async(
            lambda: events(cluster, namespace, "", EVENT_REASON),
            timeout=fakes.WATCH_WAIT,
            interval=0.05,
            what="the router's InvalidRoutingTable Event",
        )
        assert holder.current is not None
        assert holder.current.version == 2

    _refusals_common(cluster, rt_kc, namespace)
    _refused(cluster, rt_kc, "get", "configmaps", "-n", other_namespace)
    _refused(cluster, rt_kc, "create", "configmap", "forged", "-n", namespace, "--from-literal=k=v")
    _refused(cluster, rt_kc, "patch", "configmap", "tinct-routing-llm.chat", "-n", namespace, "-p", "{}")
    _refused(cluster, rt_kc, "get", "modelversions", "-n", namespace)
    _allowed(cluster, rt_kc, "get", "configmaps", "-n", namespace)


def test_cluster_wide_operator_does_its_job_and_nothing_else(
    helm: Helm, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    rel = f"cw-{namespace[-6:]}"
    _install(helm, rel, namespace, "--set", "router.enabled=false")
    op_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-operator")
    log = tmp_path / "operator.log"
    doc, _ = _modelversion("cw-1-0-0", tmp_path)
    # A ClusterKopfPeering of its own keeps this operator apart from any other in the cluster.
    peering = f"tinct-{namespace[-6:]}"
    with _operator_process(op_kc, tmp_path / "lineage", log, peering=peering, tables=namespace):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
        _ready(cluster, namespace, "cw-1-0-0", log)
        cp = _json(cluster.kubectl("get", "clusterkopfpeering", peering, "-o", "json"))
        assert (cp or {}).get("status"), "the replica announced itself cluster-wide"
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "Not enough permissions" not in text, "kopf lacked a permission it looks for"

    _refusals_common(cluster, op_kc, namespace)
    _allowed(cluster, op_kc, "get", "modelversions", "--all-namespaces")
    _refused(cluster, op_kc, "get", "secrets", "--all-namespaces")
    _refused(cluster, op_kc, "delete", "namespace", namespace, "--dry-run=server")
    _refused(cluster, op_kc, "patch", "crd", "modelversions.tinct.io", "-p", "{}")
    helm("uninstall", rel, "--namespace", namespace)


def test_grayrelease_steps_to_promoted_with_the_chart_identity(
    helm: Helm, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    from tinct_testing.release_cluster import (
        apply,
        backends,
        example,
        get,
        history,
        wait_history_written,
        wait_release,
    )

    rel = f"gr-{namespace[-6:]}"
    _install(helm, rel, namespace, "--set", "router.enabled=false", namespaced=True)
    op_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-operator")
    log, lineage = tmp_path / "operator.log", tmp_path / "lineage"
    backends(cluster, namespace, tmp_path)
    no_metrics = {"interval": "2s", "metrics": []}
    with _operator_process(
        op_kc, lineage, log, f"--namespace={namespace}", "--release-tick=0.5", tables=namespace
    ):
        apply(cluster, namespace, example(analysis=no_metrics))
        st = wait_release(cluster, namespace, lambda s: s.get("phase") == "Promoted", "Promoted")
        table = get(cluster, namespace, "configmap", f"tinct-routing-{namespace}.chat")
        hpas = {
            side: get(cluster, namespace, "hpa", f"tinct-chat-{side}") for side in ("stable", "candidate")
        }
        wait_history_written(cluster, namespace)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "APIForbiddenError" not in text, text[-4000:]
    assert st["step"] == 3
    assert table is not None
    assert json.loads(table["data"][DATA_KEY])["state"] == "Promoted"
    assert all(hpas.values()), "an HPA per backend, applied with the chart's verbs"
    steps = [(r["state"], r["step"]) for r in history(lineage)]
    assert ("Promoted", 4) in steps
    # What the controller reads it may not change.
    _refused(cluster, op_kc, "scale", "deployment", "sched-v2", "-n", namespace, "--replicas=3")
    _refused(cluster, op_kc, "delete", "deployment", "sched-v2", "-n", namespace, "--dry-run=server")
    # It may delete an HPA (its own, when a release switches to KEDA), but never anything's scale.
    _refused(
        cluster, op_kc, "patch", "deployment", "sched-v2", "-n", namespace, "-p", '{"spec":{"replicas":3}}'
    )


def _tenant_kubeconfig(cluster: Cluster, namespace: str) -> Path:
    """A tenant allowed every verb on ConfigMaps in its own namespace, and nothing else."""
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tenant", "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tenant-configmaps", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-configmaps", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    ]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    return cluster.service_account_kubeconfig(namespace, "tenant")


@contextmanager
def _router_process(kubeconfig: Path, namespace: str, log: Path) -> Iterator[int]:
    """``tinct router --watch`` as the chart runs it, acting as the chart's router ServiceAccount."""
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    # --allow-backend: the chart's allowBackends, for the tests' schedulers on loopback.
    argv = router_argv(port, "--watch", f"--namespace={namespace}", "--allow-backend=127.0.0.1")
    with spawned(argv, log, env, grace=30):
        yield port


def _answer(port: int, model: str) -> tuple[int, str]:
    """A chat completion for ``model``: (status, the answering scheduler's name or the error code)."""
    got = complete(port, model)
    doc = got.json()
    return got.status, str(doc.get("model") or (doc.get("error") or {}).get("code"))


def test_a_tenant_who_writes_configmaps_cannot_move_traffic(
    helm: Helm, cluster: Cluster, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    """Cluster scope: tables live in the chart's namespace. A tenant with every verb on
    ConfigMaps in its own namespace forges tables there — for a model a release serves,
    one no release serves yet, and one whose release comes after the forgery — and none
    of them changes which backend answers."""
    from tinct_testing.engines import Engines
    from tinct_testing.release_cluster import apply, example, modelversion, service, wait_release

    rel, tenant = f"ts-{namespace[-6:]}", other_namespace
    # A model of this test alone: the operator is cluster-wide, so it also finishes the
    # deletion of releases earlier tests left in deleted namespaces, and their standing
    # routes own the example's llama3-8b (a model belongs to the namespace that routed it first).
    model = f"llama3-8b-{rel}"
    _install(helm, rel, namespace)
    op_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-operator")
    rt_kc = cluster.service_account_kubeconfig(namespace, f"{rel}-tinct-router")
    tenant_kc = _tenant_kubeconfig(cluster, tenant)
    real = Engines(("real-v1", "real-v2"))
    evil = Engines(("evil-v1", "evil-v2"))
    log, rlog = tmp_path / "operator.log", tmp_path / "router.log"
    try:
        onnx = make_onnx(tmp_path / "m.onnx")
        apply(
            cluster,
            tenant,
            service("sched-v1"),
            service("sched-v2"),
            modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
            modelversion("llama3-8b-1-5-0", "1.5.0", onnx),
        )

        def forge(name: str, model: str, version: int) -> None:
            t = fakes.table(evil.v1.url, evil.v2.url, version=version, default_weight=100)
            t = t.model_copy(update={"models": [model], "release": name, "namespace": tenant})
            cm = routing_configmap(t, namespace=tenant)
            proc = cluster.kubectl(
                "apply", "-f", "-", kubeconfig=tenant_kc, input=json.dumps(cm), check=False
            )
            assert proc.returncode == 0, f"the tenant may write ConfigMaps in its namespace: {proc.stderr}"

        def release(name: str) -> dict[str, Any]:
            doc = example(
                analysis={"interval": "1h", "metrics": []}, cells=[{"match": {}, "weights": [0, 100]}]
            )
            doc["metadata"]["name"] = name
            doc["spec"].pop("autoscaling")
            doc["spec"]["models"] = [model]
            for side, mv, url in (
                ("stable", "llama3-8b-1-4-0", real.v1.url),
                ("candidate", "llama3-8b-1-5-0", real.v2.url),
            ):
                doc["spec"][side].pop("deployment")
                doc["spec"][side].update(modelVersion=mv, url=url)
            return doc

        forge("chat", model, 1_000_000)  # before the release exists
        forge("free", "mistral-7b", 1)  # a model no release serves
        with (
            _operator_process(
                op_kc, tmp_path / "lineage", log, "--release-tick=0.5", peering=f"t-{rel}", tables=namespace
            ),
            _router_process(rt_kc, namespace, rlog) as port,
        ):
            apply(cluster, tenant, release("chat"))
            wait_release(cluster, tenant, lambda s: s.get("phase") == "Progressing", "Progressing")
            eventually(
                lambda: _answer(port, model)[0] == 200,
                timeout=WAIT,
                what=f"the router to serve {model}",
                explain=lambda: _tail(rlog),
            )
            forge("chat", model, 2_000_000)  # while the release serves it
            time.sleep(3)  # time a router that believed the forgery would need to follow it
            answers = {m: {_answer(port, m) for _ in range(20)} for m in (model, "mistral-7b")}
    finally:
        real.stop()
        evil.stop()
    assert answers[model] == {(200, "real-v1")}, "step 1/2 sends nothing to the candidate"
    assert answers["mistral-7b"] == {(404, "model_not_found")}
    assert (evil.v1.state.received, evil.v2.state.received) == (0, 0)
    # Where the tables live, the tenant cannot write; neither chart identity reaches the tenant's ConfigMaps.
    _refused(cluster, tenant_kc, "create", "configmap", "forged", "-n", namespace, "--from-literal=k=v")
    _refused(cluster, rt_kc, "get", "configmaps", "-n", tenant)
    _refused(cluster, rt_kc, "get", "configmaps", "--all-namespaces")
    _refused(cluster, op_kc, "create", "configmap", "x", "-n", tenant, "--from-literal=k=v")
    _refused(cluster, op_kc, "get", "configmaps", "-n", tenant)
    assert "Traceback" not in log.read_text()

"""Tenants of the shared router fleet attack it, each with its own ServiceAccount token, and lose.

Every tenant gets what the chart documents for tenants: Kubernetes' ``edit`` in its own
namespace, into which the chart aggregates ``<release>-tinct-edit`` (ModelVersions and
GrayReleases, never their ``/status``). The operator and the router run as processes with
the tokens of the ServiceAccounts ``helm install`` created, the operator with the status key
from the Secret the chart generated; the router reaches the tenants' Services by their
cluster DNS names through ``--resolve``, at emulated engines on loopback. One test per rule of
the *Tenants* section of docs/guides/multi-tenant.md:

1. a status is a record, not a command: a forged status, and an old sealed one written back,
   never change a routing table (a tenant whose role grants ``tinct.io`` with a wildcard);
2. a namespace claims nothing outside itself: a release naming another namespace's model,
   live and then standing, gets ``ModelConflict`` and not one of its requests;
3. a release's backends stay in its namespace: another namespace's Service or loopback is
   refused by the operator, and a table naming one is refused by the router;
4. big objects stay manageable: the largest spec the CRD accepts, a 200 KiB annotation and
   annotations at the API server's limit are deleted cleanly; a 253-character name keeps one
   HPA per side;
5. a dead webhook does not delay another release's notifications by more than a minute.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinct.api.names import label_value
from tinct.api.routing import DATA_KEY, configmap_name, routing_configmap
from tinct.operator.bookkeeping import ANNOTATIONS_LIMIT
from tinct.router.watch import CONFLICT_REASON, EVENT_REASON
from tinct_testing.commands import TINCT, router_argv
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.controlplane.helm import Helm
from tinct_testing.controlplane.process import http_ok, spawned, wait_ready
from tinct_testing.engines import Engines
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.notify_receiver import Receiver, receiver
from tinct_testing.paths import CHART
from tinct_testing.release_cluster import (
    Versions,
    deployment,
    events,
    example,
    get,
    modelversion,
    service,
    table,
)
from tinct_testing.router_fakes import table as table_doc
from tinct_testing.wait import WAIT, eventually

#: The key of the only cell of the releases here (``match: {}``).
CELL = "len:*+role:*+latency:*"
#: A GrayRelease name of 253 characters, the API's limit.
LONGEST = "l" + "o" * 250 + "ng"


@dataclass
class Tenant:
    """A namespace and the token of its tenant, who has Kubernetes' ``edit`` there."""

    cluster: Cluster
    ns: str
    kubeconfig: Path
    engines: Engines

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the tenant; with ``check``, a refusal fails saying why."""
        out = self.cluster.kubectl(*args, "-n", self.ns, input=input, check=False, kubeconfig=self.kubeconfig)
        assert not check or out.returncode == 0, f"kubectl {args[0]} as the tenant of {self.ns}: {out.stderr}"
        return out

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def status(self, name: str) -> dict[str, Any]:
        st: dict[str, Any] = (get(self.cluster, self.ns, "grayrelease", name) or {}).get("status") or {}
        return st

    def wait(self, name: str, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        st: dict[str, Any] = eventually(
            lambda: (s := self.status(name)) and pred(s) and s, timeout=WAIT, what=f"{self.ns}/{name}: {what}"
        )
        return st


@dataclass
class Fleet:
    """The chart installed in ``chart_ns`` (where the routing tables live), its operator and
    router running as processes with the chart's identities, and the tenants, each with the
    Services and ModelVersions its releases name (:func:`_objects`)."""

    cluster: Cluster
    chart_ns: str
    tenants: dict[str, Tenant]
    router_port: int = 0
    operator_metrics: int = 0
    logs: list[Path] = field(default_factory=list)


def _condition(status: dict[str, Any], type_: str) -> tuple[str, str, str]:
    c = next((c for c in status.get("conditions") or [] if c["type"] == type_), None)
    return (c["status"], c["reason"], c["message"]) if c else ("", "", "")


def _account(
    cluster: Cluster, ns: str, name: str, role: str, rules: list[dict[str, Any]] | None = None
) -> None:
    """ServiceAccount ``name`` of ``ns`` bound there to the ClusterRole ``role``, or with ``rules``
    to a Role of that name."""
    kind = "Role" if rules is not None else "ClusterRole"
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        },
    ]
    if rules is not None:
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": role, "namespace": ns},
                "rules": rules,
            }
        )
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def _tenant(cluster: Cluster, ns: str) -> Path:
    """ServiceAccount ``tenant`` of ``ns``, bound to Kubernetes' ``edit`` there; its kubeconfig."""
    _account(cluster, ns, "tenant", "edit")
    who = f"--as=system:serviceaccount:{ns}:tenant"

    def can(*what: str) -> bool:
        out = cluster.kubectl("auth", "can-i", *what, "-n", ns, who, check=False).stdout.strip()
        return out == "yes"

    # The chart's tenant role reaches `edit` through aggregation: wait for it, and no /status.
    eventually(
        lambda: can("create", "grayreleases.tinct.io"),
        timeout=WAIT,
        what="the chart's tenant role aggregated into edit",
    )
    assert not can("patch", "grayreleases.tinct.io", "--subresource=status")
    return cluster.service_account_kubeconfig(ns, "tenant")


@contextmanager
def _process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running for the block, which it must outlive."""
    with spawned(argv, log, env, grace=30) as proc:
        yield proc
        assert proc.poll() is None, f"{argv[3]} exited:\n{log.read_text()[-4000:]}"


@contextmanager
def _fleet(
    cluster: Cluster,
    helm: Helm,
    chart_ns: str,
    tmp: Path,
    tenants: tuple[str, ...],
    *,
    router: bool = True,
    **operator_env: str,
) -> Iterator[Fleet]:
    rel = f"tn-{chart_ns[-6:]}"
    helm("install", rel, str(CHART), "--namespace", chart_ns)
    names = {t: f"tenant-{t}-{uuid.uuid4().hex[:8]}" for t in tenants}
    with ExitStack() as stack:
        stack.callback(lambda: helm("uninstall", rel, "--namespace", chart_ns, check=False))
        for ns in names.values():
            cluster.kubectl("create", "namespace", ns)
            stack.callback(
                lambda n=ns: cluster.kubectl("delete", "namespace", n, "--wait=false", check=False)
            )
        fleet = Fleet(cluster, chart_ns, {})
        for t, ns in names.items():
            engines = Engines((f"{t}-v1", f"{t}-v2"))
            stack.callback(engines.stop)
            fleet.tenants[t] = Tenant(cluster, ns, _tenant(cluster, ns), engines)
            _objects(fleet.tenants[t], tmp)
        # The key the chart generated, as its Pod mounts it.
        encoded = cluster.kubectl(
            "get", "secret", f"{rel}-tinct-status-key", "-n", chart_ns, "-o", "jsonpath={.data.key}"
        ).stdout
        key = tmp / "status-key"
        key.write_bytes(base64.b64decode(encoded))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TINCT_")}
        op_log, fleet.operator_metrics = tmp / "operator.log", free_port()
        fleet.logs.append(op_log)
        op_env = {
            **env,
            "KUBECONFIG": str(cluster.service_account_kubeconfig(chart_ns, f"{rel}-tinct-operator")),
            "TINCT_TABLE_NAMESPACE": chart_ns,
            "TINCT_ARTIFACT_ROOTS": str(tmp),
            "TINCT_STATUS_KEY_FILE": str(key),
            **operator_env,
        }
        argv = [*TINCT, "operator", f"--lineage-root={tmp / 'lineage'}"]
        argv += ["--release-tick=0.5", f"--metrics-port={fleet.operator_metrics}"]
        argv += [f"--namespace={ns}" for ns in names.values()]
        stack.enter_context(_process(argv, op_env, op_log))
        if router:
            rt_log, fleet.router_port, metrics = tmp / "router.log", free_port(), free_port()
            fleet.logs.append(rt_log)
            argv = router_argv(fleet.router_port, "--watch", f"--namespace={chart_ns}")
            argv += [f"--metrics-port={metrics}", "--workers=1"]
            for t in fleet.tenants.values():
                for name, engine in (("sched-v1", t.engines.v1), ("sched-v2", t.engines.v2)):
                    argv.append(f"--resolve={name}.{t.ns}.svc.cluster.local:8000=127.0.0.1:{engine.port}")
            rt_env = {
                **env,
                "KUBECONFIG": str(cluster.service_account_kubeconfig(chart_ns, f"{rel}-tinct-router")),
            }
            proc = stack.enter_context(_process(argv, rt_env, rt_log))
            ready = f"http://127.0.0.1:{metrics}/readyz"
            wait_ready("the router", lambda: http_ok(ready), proc, time.monotonic() + WAIT, log=rt_log)
        yield fleet
    for log in fleet.logs:
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
        assert "Forbidden" not in text, text[-4000:]


def _objects(tenant: Tenant, tmp: Path) -> None:
    """The Services and the two ModelVersions every release of a tenant uses, applied as it."""
    onnx = make_onnx(tmp / f"{tenant.ns}.onnx")
    tenant.apply(
        service("sched-v1"),
        service("sched-v2"),
        modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
        modelversion("llama3-8b-2-0-0", "1.5.0", onnx),
    )


def _release(
    name: str, models: list[str], weights: list[float], interval: str = "1h", **spec: Any
) -> dict[str, Any]:
    """The shipped example with one cell, serving ``models``, through the tenant's Services."""
    doc = example(analysis={"interval": interval, "metrics": []}, cells=[{"match": {}, "weights": weights}])
    doc["metadata"]["name"] = name
    doc["spec"].pop("autoscaling")
    for side in ("stable", "candidate"):
        doc["spec"][side].pop("deployment")
    doc["spec"].update(models=models, **spec)
    return doc


def _ask(port: int, model: str, session: str) -> tuple[int, str]:
    """A chat completion for ``model``: (status, the answering engine or the error code)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        headers = {"Content-Type": "application/json", "X-Session-Id": session}
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        resp = conn.getresponse()
        doc = json.loads(resp.read() or b"{}")
        return resp.status, str(doc.get("model") or (doc.get("error") or {}).get("code"))
    finally:
        conn.close()


def _weights(cm: dict[str, Any]) -> list[float]:
    return [c["weight"] for c in json.loads(cm["data"][DATA_KEY])["cells"]]


def _tampers(cluster: Cluster, ns: str) -> list[str]:
    """The messages of the StatusTampered Events in ``ns``, oldest first."""
    said = events(cluster, ns, reason="StatusTampered")
    return [
        e["message"] for e in sorted(said, key=lambda e: e.get("eventTime") or e.get("firstTimestamp") or "")
    ]


# --- 1. status is a record, not a command --------------------------------------------------------


def _wildcard(cluster: Cluster, ns: str) -> Path:
    """A tenant whose Role grants the tinct.io group's resources with a wildcard, as many do."""
    _account(
        cluster,
        ns,
        "wild",
        "tinct-everything",
        [{"apiGroups": ["tinct.io"], "resources": ["*"], "verbs": ["*"]}],
    )
    return cluster.service_account_kubeconfig(ns, "wild")


def test_a_forged_or_replayed_status_never_changes_a_routing_table(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    with _fleet(cluster, helm, namespace, tmp_path, ("a",)) as fleet:
        a = fleet.tenants["a"]
        a.apply(_release("chat", ["m-status"], [20, 100]))
        sealed = a.wait("chat", lambda s: s.get("phase") == "Progressing", "step 1/2 at 20 %")
        eventually(
            lambda: _ask(fleet.router_port, "m-status", "x")[0] == 200,
            timeout=WAIT,
            what="the router serving m-status",
        )
        with Versions(cluster, namespace, "configmap", configmap_name(a.ns, "chat")) as tables:
            # The chart's tenant role has no /status.
            denied = a.kubectl(
                "patch",
                "gr",
                "chat",
                "--subresource=status",
                "--type=merge",
                "-p",
                '{"status":{}}',
                check=False,
            )
            # A tenant whose role grants tinct.io with a wildcard writes "Promoted".
            wild = _wildcard(cluster, a.ns)
            forged = {"phase": "Promoted", "step": 1, "weights": {CELL: 100}, "candidateWeight": 100}
            cluster.kubectl(
                "patch", "gr", "chat", "-n", a.ns, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": forged}), kubeconfig=wild,
            )  # fmt: skip
            restored = a.wait(
                "chat",
                lambda s: (
                    _condition(s, "StatusVerified")[1] == "StatusTampered" and s.get("phase") == "Progressing"
                ),
                "the forged status restored",
            )
            time.sleep(3)  # six ticks: a status taken for a command would have moved the table by now
            after_forgery = _tampers(cluster, a.ns)
            # The tenant aborts (its right): everything to stable, for good.
            a.kubectl("annotate", "gr", "chat", "tinct.io/action=abort@a1-x")
            rolled = a.wait("chat", lambda s: s.get("phase") == "RolledBack", "RolledBack")
            eventually(
                lambda: (t := table(cluster, a.ns, "chat", namespace)) and t[1]["cells"][0]["weight"] == 0,
                timeout=WAIT,
                what="the table at 0",
            )

            # The sealed status of step 1/2 written back whole: older than the operator's record.
            def replay() -> bool:
                obj = get(cluster, a.ns, "grayrelease", "chat")
                assert obj is not None
                body = json.dumps({**obj, "status": sealed})
                done = cluster.kubectl(
                    "replace", "--subresource=status", "-f", "-", input=body, check=False, kubeconfig=wild
                )
                return done.returncode == 0

            eventually(replay, timeout=WAIT, what="the old status written back")
            eventually(
                lambda: any("replayed" in m for m in _tampers(cluster, a.ns)),
                timeout=WAIT,
                what="the replay noticed",
            )
            back = a.wait("chat", lambda s: s.get("phase") == "RolledBack", "the replayed status restored")
            time.sleep(3)
            said = _tampers(cluster, a.ns)
            answers = [_ask(fleet.router_port, "m-status", f"s-{i}") for i in range(40)]
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert (restored["step"], restored["candidateWeight"]) == (0, 20)
    status, reason, message = _condition(restored, "StatusVerified")
    assert (status, reason) == ("False", "StatusTampered")
    assert "its seal does not verify" in message
    assert len(after_forgery) == 1, "told once; the restored status verifies"
    assert (rolled["phase"], back["phase"], back["candidateWeight"]) == ("RolledBack", "RolledBack", 0)
    assert len(said) == 2, said
    assert "its seal does not verify" in said[0]
    assert "older status" in said[1]
    assert "replayed" in said[1]
    # Every table the routers could see: 20 % until the abort, then 0 %; never the forged 100 %,
    # never the replayed 20 % after the abort.
    shares = [_weights(c)[0] for _, c in tables.seen]
    assert shares, "the table was watched"
    assert set(shares) <= {20, 0}, shares
    assert shares == sorted(shares, reverse=True), shares
    assert set(answers) == {(200, "a-v1")}, "rolled back: stable answers everything"


# --- 2. a namespace claims nothing outside itself -----------------------------------------------


def test_a_release_of_another_namespace_never_takes_a_model_live_or_standing(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    with _fleet(cluster, helm, namespace, tmp_path, ("a", "b")) as fleet:
        a, b = fleet.tenants["a"], fleet.tenants["b"]
        port = fleet.router_port
        b.apply(_release("owner", ["m-shared"], [0, 100]))
        b.wait("owner", lambda s: s.get("phase") == "Progressing", "Progressing")
        b.kubectl("annotate", "gr", "owner", "tinct.io/action=promote@a1-p")
        b.wait("owner", lambda s: s.get("phase") == "Promoted", "Promoted")
        eventually(
            lambda: _ask(port, "m-shared", "x") == (200, "b-v2"),
            timeout=WAIT,
            what="b's candidate answering m-shared",
        )
        # Tenant a names b's model, at 100 % from its first step.
        a.apply(_release("taker", ["m-shared"], [100]))
        live = a.wait(
            "taker", lambda s: _condition(s, "RouteAvailable")[1] == "ModelConflict", "ModelConflict"
        )
        eventually(lambda: table(cluster, a.ns, "taker", namespace), timeout=WAIT, what="a's table written")
        time.sleep(2)  # the router has both tables
        while_live = [_ask(port, "m-shared", f"l-{i}") for i in range(50)]
        # Tenant b deletes its release: its route is kept, standing.
        b.kubectl("delete", "gr", "owner", "--timeout=120s")
        time.sleep(3)  # six ticks of a's release
        standing = table(cluster, b.ns, "owner", namespace)
        left = a.status("taker")
        while_standing = [_ask(port, "m-shared", f"s-{i}") for i in range(50)]
        conflicts = events(cluster, namespace, "ConfigMap", CONFLICT_REASON)
        # A release of b's own namespace takes it over: the standing route goes.
        b.apply(_release("next", ["m-shared"], [0, 100]))
        eventually(
            lambda: table(cluster, b.ns, "owner", namespace) is None,
            timeout=WAIT,
            what="b's standing route retired",
        )
        eventually(
            lambda: _ask(port, "m-shared", "y") == (200, "b-v1"),
            timeout=WAIT,
            what="b's next release answering m-shared",
            explain=lambda: (
                f"the router answered {_ask(port, 'm-shared', 'y')}; b's next: {b.status('next')}; "
                f"tables: {table(cluster, b.ns, 'next', namespace)} {table(cluster, a.ns, 'taker', namespace)} "
                + cluster.kubectl(
                    "get",
                    "cm",
                    "-n",
                    namespace,
                    "-o",
                    "custom-columns=N:.metadata.name,C:.metadata.creationTimestamp",
                ).stdout
            ),
        )
        taken_over = a.status("taker")
        a_received = a.engines.received(a.engines.v1) + a.engines.received(a.engines.v2)
    assert _condition(live, "RouteAvailable")[:2] == ("False", "ModelConflict")
    assert _condition(live, "RouteAvailable")[2].startswith(
        f"model m-shared belongs to namespace {b.ns}, which routed it first (GrayRelease {b.ns}/owner)"
    )
    assert set(while_live) == {(200, "b-v2")}
    assert standing is not None
    assert standing[1]["standing"] is True
    assert _condition(left, "RouteAvailable")[:2] == ("False", "ModelConflict")
    assert "the standing route of its deleted GrayRelease" in _condition(left, "RouteAvailable")[2]
    assert set(while_standing) == {(200, "b-v2")}, "the standing route keeps b's promoted candidate"
    assert conflicts, "the router told a's table why it does not serve m-shared"
    assert _condition(taken_over, "RouteAvailable")[:2] == ("False", "ModelConflict")
    assert a_received == 0, "not one request for b's model reached a's backends"


# --- 3. backends a tenant may name --------------------------------------------------------------


def test_a_release_cannot_send_traffic_outside_its_namespace(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    with _fleet(cluster, helm, namespace, tmp_path, ("a", "b")) as fleet:
        a, b = fleet.tenants["a"], fleet.tenants["b"]
        theirs = f"http://sched-v1.{b.ns}.svc.cluster.local:8000"
        loopback = f"http://127.0.0.1:{b.engines.v2.port}"  # in a cluster: the router Pod's own
        borrow = _release("borrow", ["m-borrow"], [100])
        borrow["spec"]["candidate"]["url"] = theirs
        loop = _release("loop", ["m-loop"], [100])
        loop["spec"]["stable"]["url"] = loopback
        # Its own Services it may name: this one routes.
        a.apply(borrow, loop, _release("mine", ["m-a"], [100]))
        eventually(
            lambda: _ask(fleet.router_port, "m-a", "x") == (200, "a-v2"),
            timeout=WAIT,
            what="a's own release answering",
        )
        refused = {
            name: a.wait(name, lambda s: s.get("phase") == "Failed", "Failed") for name in ("borrow", "loop")
        }
        time.sleep(2)
        written = {name: table(cluster, a.ns, name, namespace) for name in ("borrow", "loop")}
        answers = {m: _ask(fleet.router_port, m, "x") for m in ("m-borrow", "m-loop")}
        # A table naming b's Service written by anything but this operator: the router refuses it.
        forged = table_doc(
            theirs, f"http://sched-v2.{a.ns}.svc.cluster.local:8000", version=1, default_weight=100
        )
        forged = forged.model_copy(update={"release": "forged", "namespace": a.ns, "models": ["m-forged"]})
        cluster.kubectl("apply", "-f", "-", input=json.dumps(routing_configmap(forged, namespace=namespace)))

        def rejected() -> list[dict[str, Any]]:
            forged_name = configmap_name(a.ns, "forged")
            said = events(cluster, namespace, "ConfigMap", EVENT_REASON)
            return [e for e in said if e["involvedObject"]["name"] == forged_name]

        refusal = eventually(rejected, timeout=WAIT, what="the router's refusal of the forged table")
        forged_answer = _ask(fleet.router_port, "m-forged", "x")
        b_received = b.engines.received(b.engines.v1) + b.engines.received(b.engines.v2)
    for name, url, side in (("borrow", theirs, "candidate"), ("loop", loopback, "stable")):
        status, reason, message = _condition(refused[name], "BackendsAvailable")
        assert (status, reason) == ("False", "BackendNotAllowed"), refused[name]
        assert message.startswith(f"{side} backend spec.{side}.url: {url} is outside the release's namespace")
        assert f"a Service of namespace {a.ns}" in message
        assert written[name] is None, "no table naming it is written"
    assert answers == {"m-borrow": (404, "model_not_found"), "m-loop": (404, "model_not_found")}
    assert "is outside the release's namespace" in refusal[0]["message"]
    assert forged_answer == (404, "model_not_found")
    assert b_received == 0, "nothing reached b's backends"


# --- 4. big objects stay manageable -------------------------------------------------------------


def _label(n: int, tag: str) -> str:
    """A Prometheus label name of 128 characters."""
    return f"k{tag}{n:04d}".ljust(128, "x")


def _largest(ns: str) -> dict[str, Any]:
    """A GrayRelease at the schema's bounds: every list at its maxItems, every string at its
    maxLength (within its pattern), every map at its maxProperties with the longest keys."""

    def word(prefix: str, n: int, length: int = 63) -> str:
        return f"{prefix}{n:03d}".ljust(length, "z")

    def side(name: str, port: int) -> dict[str, Any]:
        return {
            "modelVersion": name * 253,
            "service": name * 253,
            "port": port,
            "deployment": name * 253,
            "schedulerVersion": name.upper() * 63,
            "url": f"http://{name * 499}:{port}",
            "engine": "sglang",
            "metricsSelector": {_label(i, name): "v" * 256 for i in range(8)},
        }

    buckets = [{"name": word("b", i), "maxTokens": 1_000_000 + i} for i in range(15)] + [
        {"name": word("b", 15)}
    ]
    roles, latencies = [word("r", i) for i in range(32)], [word("t", i) for i in range(16)]
    weights = [round(i * 100 / 63 - 1e-9 * (i > 0), 12) for i in range(64)]
    # 63 cells besides the default one, each its own (bucket, role) pair, at their longest names.
    cells = [{"match": {}, "weights": weights}] + [
        {
            "match": {
                "promptLength": buckets[i % 16]["name"],
                "role": roles[i // 16],
                "latency": latencies[i % 16],
            },
            "weights": weights,
        }
        for i in range(63)
    ]
    keda_side = lambda tag: {"labels": {_label(i, tag): "w" * 256 for i in range(16)}}  # noqa: E731
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "GrayRelease",
        "metadata": {"name": "largest", "namespace": ns},
        "spec": {
            "stable": side("s", 65534),
            "candidate": side("c", 65535),
            "models": [f"m{i:02d}".ljust(253, "M") for i in range(32)],
            "dye": {
                "promptLength": {"buckets": buckets, "charsPerToken": 4},
                "role": {"header": "R" * 128, "values": roles, "default": roles[0]},
                "latency": {
                    "header": "L" * 128,
                    "values": latencies,
                    "default": latencies[0],
                    "streamClass": latencies[1],
                },
                "stickyKey": {"header": "S" * 128},
            },
            "cells": cells,
            "analysis": {
                "interval": "1h" * 16,
                "failureLimit": 100,
                "minRequests": 10_000_000,
                "inconclusiveLimit": 10000,
                "perCell": True,
                "prometheus": {"url": "http://" + "p" * 2041},
                "metrics": [
                    {
                        "name": "custom",
                        "query": f"q{i:02d}".ljust(4096, "q"),
                        "min": -1e300,
                        "max": 1e300,
                        "maxStableDelta": 1e300,
                    }
                    for i in range(16)
                ],
            },
            "fallback": {
                "consecutiveFailures": 1000,
                "latencyMs": 600000,
                "cooldownSeconds": 86400,
                "idleTimeoutMs": 3600000,
            },
            "autoscaling": {
                "minReplicas": 10000,
                "maxReplicas": 10000,
                "metric": {"pods": "p" * 253, "averageValue": "1." + "0" * 29 + "M"},
                "keda": {
                    "prometheus": {"url": "http://" + "k" * 2041},
                    "targetPerReplica": 1e9,
                    "stable": keda_side("s"),
                    "candidate": keda_side("c"),
                    "scaleUpStabilizationSeconds": 3600,
                    "scaleDownStabilizationSeconds": 3600,
                },
            },
            "notify": [
                {"name": word("n", i).lower(), "on": ["CandidateUnavailable", "ProgressDeadlineExceeded"] * 8}
                for i in range(8)
            ],
            "paused": True,
            "allowMajorUpgrade": True,
            "progressDeadlineSeconds": 604800,
            "progressDeadlineAbort": True,
            "routeOnDelete": "Remove",
        },
    }


def _refused_by_schema(tenant: Tenant, doc: dict[str, Any]) -> bool:
    out = tenant.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    return out.returncode != 0 and "invalid" in out.stderr.lower()


def test_big_releases_are_deleted_cleanly_and_long_names_keep_one_hpa_per_side(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    with _fleet(cluster, helm, namespace, tmp_path, ("a",), router=False) as fleet:
        a = fleet.tenants["a"]
        a.apply(deployment("sched-v1"), deployment("sched-v2"))
        big = _largest(a.ns)
        size = len(json.dumps(big["spec"], separators=(",", ":")))
        # At the bounds: one item more, or one character more, is refused.
        over = json.loads(json.dumps(big))
        over["spec"]["models"].append("one-more")
        longer = json.loads(json.dumps(big))
        longer["spec"]["analysis"]["metrics"][0]["query"] += "q"
        beyond = (_refused_by_schema(a, over), _refused_by_schema(a, longer))
        # A client-side apply copies the whole object into kubectl's own annotation too.
        a.apply(big)
        annotated = _release("annotated", ["m-ann"], [0, 100])
        annotated["metadata"]["annotations"] = {"team.example/notes": "n" * 200 * 1024}
        full = _release("full", ["m-full"], [0, 100])
        key = "team.example/everything"
        full["metadata"]["annotations"] = {key: "f" * (ANNOTATIONS_LIMIT - len(key) - 64)}
        for doc in (annotated, full):
            a.kubectl("create", "-f", "-", input=json.dumps(doc))
        handled = {
            name: a.wait(name, lambda s: bool(s.get("phase")), "handled") for name in ("largest", "annotated")
        }
        left_out = a.wait(
            "full", lambda s: _condition(s, "Bookkeeping")[1] == "AnnotationsTooLarge", "Bookkeeping=False"
        )
        kopf_base = len(
            (get(cluster, a.ns, "grayrelease", "largest") or {})["metadata"]["annotations"].get(
                "tinct.io/last-handled-configuration", ""
            )
        )
        deleted = {
            name: a.kubectl("delete", "gr", name, "--timeout=120s", check=False)
            for name in ("largest", "annotated", "full")
        }
        gone = {name: get(cluster, a.ns, "grayrelease", name) is None for name in deleted}

        # A 253-character name: one HPA per side, each on its own Deployment, for good.
        long = example(
            analysis={"interval": "1h", "metrics": []}, cells=[{"match": {}, "weights": [0, 50, 100]}]
        )
        long["metadata"]["name"] = LONGEST
        a.apply(long)
        # Written: applied, or (the example's Pods metric has no custom metrics API here) told so.
        ready = a.wait(
            LONGEST,
            lambda s: _condition(s, "AutoscalingReady")[1] in ("Applied", "MetricUnavailable"),
            "AutoscalingReady",
        )

        def hpas() -> set[tuple[str, str]]:
            mine = f"tinct.io/release={label_value(LONGEST)}"
            out = json.loads(cluster.kubectl("get", "hpa", "-n", a.ns, "-l", mine, "-o", "json").stdout)
            return {(h["metadata"]["name"], h["spec"]["scaleTargetRef"]["name"]) for h in out["items"]}

        eventually(lambda: len(hpas()) == 2, timeout=WAIT, what="an HPA per side")
        seen = set()
        for _ in range(25):  # five seconds: ten ticks of the release
            seen |= hpas()
            time.sleep(0.2)
        routing = table(cluster, a.ns, LONGEST, namespace)
    assert size > 150 * 1024, size
    assert beyond == (True, True)
    assert all(handled.values())
    assert kopf_base < 1024, "kopf's diff base is a digest, not a copy"
    status, reason, message = _condition(left_out, "Bookkeeping")
    assert (status, reason) == ("False", "AnnotationsTooLarge")
    assert "past the API server's 262144" in message
    for name, out in deleted.items():
        assert out.returncode == 0, (name, out.stderr)
    assert gone == {"largest": True, "annotated": True, "full": True}
    assert _condition(ready, "AutoscalingReady")[1] in ("Applied", "MetricUnavailable")
    assert len(seen) == 2, f"each HPA kept its one target: {seen}"
    (stable_hpa, stable_target), (candidate_hpa, candidate_target) = sorted(seen, key=lambda s: s[1])
    assert (stable_target, candidate_target) == ("sched-v1", "sched-v2")
    assert stable_hpa.endswith("-stable")
    assert candidate_hpa.endswith("-candidate")
    assert len(stable_hpa) <= 253
    assert len(candidate_hpa) <= 253
    assert routing is not None, "its routing table, under a name that fits"


# --- 5. a dead webhook costs seconds --------------------------------------------------------------


def _notify_metrics(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for m in re.finditer(r"^(tinct_release_notif\w+)\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def test_a_dead_webhook_does_not_delay_another_releases_notifications(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    with receiver() as rec:
        hooks = f"dead=json:{rec.url('/hang/dead')},team=json:{rec.url('/ok/team')}"
        with _fleet(
            cluster, helm, namespace, tmp_path, ("a", "b"), router=False,
            TINCT_NOTIFIERS=hooks, TINCT_NOTIFY_TIMEOUT="2", TINCT_NOTIFY_RETRY_AFTER="5",
        ) as fleet:  # fmt: skip
            a, b = fleet.tenants["a"], fleet.tenants["b"]
            steps = [10.0 * i for i in range(1, 11)]
            # Tenant a's release names a receiver that accepts and never answers; b's a live one.
            a.apply(_release("noisy", ["m-a"], steps, interval="2s", notify=[{"name": "dead"}]))
            a.wait("noisy", lambda s: (s.get("transitions") or 0) >= 3, "a's first transitions")
            b.apply(_release("quiet", ["m-b"], steps, interval="2s", notify=[{"name": "team"}]))
            quiet = b.wait("quiet", lambda s: s.get("phase") == "Promoted", "b Promoted")
            noisy = a.wait("noisy", lambda s: s.get("phase") == "Promoted", "a Promoted")
            uid = (get(cluster, b.ns, "grayrelease", "quiet") or {})["metadata"]["uid"]
            eventually(
                lambda: len(_delivered(rec, uid)) == quiet["transitions"],
                timeout=WAIT,
                what="every transition of b's release delivered",
            )
            dropped = eventually(
                lambda: (
                    (m := _notify_metrics(fleet.operator_metrics))
                    and m.get(("tinct_release_notifications_total", 'notifier="dead",result="dropped"'), 0)
                    >= noisy["transitions"] - 1
                    and m
                ),
                timeout=WAIT,
                what="a's notifications dropped by the open breaker",
            )
            attempts = rec.attempts.get("/hang/dead", 0)
            # The receiver answers again: once the breaker's wait is over, the next one goes through.
            rec.hang = False
            time.sleep(6)
            a.apply(_release("again", ["m-a2"], [0, 100], notify=[{"name": "dead"}]))
            eventually(lambda: rec.at("/hang/dead"), timeout=WAIT, what="the revived receiver notified")
            revived = _notify_metrics(fleet.operator_metrics)
            # Twenty transitions, each written twice (then its history dropped): none of the
            # operator's own statuses was ever taken for someone else's.
            honest = _tampers(cluster, a.ns) + _tampers(cluster, b.ns)
    delivered = _delivered(rec, uid)
    assert honest == []
    assert sorted(delivered) == list(range(quiet["transitions"]))
    late = {seq: at - when for seq, (when, at) in delivered.items()}
    assert max(late.values()) < 60, f"b's notifications waited behind a's dead receiver: {late}"
    assert dropped[("tinct_release_notifier_open", 'notifier="dead"')] == 1
    assert dropped[("tinct_release_notifier_opened_total", 'notifier="dead"')] >= 1
    assert attempts < 3 + noisy["transitions"], (
        f"a dead receiver costs a few attempts, not six each: {attempts}"
    )
    assert revived[("tinct_release_notifier_open", 'notifier="dead"')] == 0
    assert revived[("tinct_release_notifications_total", 'notifier="dead",result="sent"')] >= 1


def _delivered(rec: Receiver, uid: str) -> dict[int, tuple[float, float]]:
    """Transition number -> (when it happened, when the receiver got it) of release ``uid``."""
    from datetime import datetime

    out = {}
    for r in rec.at("/ok/team"):
        release, _, seq = str(r.body["id"]).partition("/")
        if release == uid:
            when = datetime.fromisoformat(str(r.body["time"]).replace("Z", "+00:00")).timestamp()
            out[int(seq)] = (when, r.at)
    return out

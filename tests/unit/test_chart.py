"""charts/tinct with the real helm: lint, render, RBAC shape, security, schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tinct_testing.chart_helpers import CHART, by_kind, container, one, sets, template
from tinct_testing.controlplane.helm import Helm, HelmError
from tinct_testing.paths import CRDS


@pytest.fixture(scope="module")
def helm(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm for rendering only: no cluster, a private home."""
    return Helm(helm_bin, tmp_path_factory.mktemp("helm-home"))


NAMESPACED = {"scope": "namespaced", "watchNamespaces": ["llm", "llm-canary"]}

#: What each identity may do, exactly: (apiGroup, resource) -> verbs.
OPERATOR_NAMESPACED = {
    ("", "events"): {"create"},
    ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch", "create"},
    ("tinct.io", "modelversions"): {"get", "list", "watch", "patch"},
    ("tinct.io", "grayreleases"): {"get", "list", "watch", "patch"},
    ("tinct.io", "modelversions/status"): {"get", "patch"},
    ("tinct.io", "grayreleases/status"): {"get", "update"},
    ("tinct.io", "modelversions/finalizers"): {"update"},
    ("tinct.io", "grayreleases/finalizers"): {"update"},
    ("autoscaling", "horizontalpodautoscalers"): {"get", "list", "watch", "create", "patch", "delete"},
    ("keda.sh", "scaledobjects"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list"},
    ("apps", "deployments"): {"get", "list", "watch"},
}
DISCOVERY = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}
OPERATOR_CLUSTER = {
    **{k: v for k, v in OPERATOR_NAMESPACED.items() if k[1] != "kopfpeerings"},
    ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch", "create"},
    **DISCOVERY,
}
ROUTER = {("", "configmaps"): {"get", "list", "watch"}, ("", "events"): {"create"}}
#: What tenants get, aggregated into Kubernetes' view and edit/admin: never a /status.
TENANT_VIEW = {
    ("tinct.io", "modelversions"): {"get", "list", "watch"},
    ("tinct.io", "grayreleases"): {"get", "list", "watch"},
}
TENANT_EDIT = {
    ("tinct.io", r): {"create", "update", "patch", "delete", "deletecollection"}
    for r in ("modelversions", "grayreleases")
}
#: The routing tables, in the chart's namespace only: no identity reaches a ConfigMap elsewhere.
TABLES = {("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"}}


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaced"])
def test_lint_is_clean_in_strict_mode(helm: Helm, values: dict[str, Any]) -> None:
    out = helm("lint", "--strict", str(CHART), *sets(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout, out.stdout
    assert "[WARNING]" not in out.stdout, out.stdout
    assert "[ERROR]" not in out.stdout, out.stdout


def test_defaults_render_operator_router_and_cluster_rbac(helm: Helm) -> None:
    docs = template(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Deployment",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Secret",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
        ]
    ), "ServiceMonitor, NetworkPolicy and templated CRDs are off by default"
    assert _grants(one(docs, "ClusterRole", "t-tinct-operator")) == OPERATOR_CLUSTER
    tables = one(docs, "Role", "t-tinct-operator-tables")
    assert (tables["metadata"]["namespace"], _grants(tables)) == ("tinct", TABLES)
    router_role = one(docs, "Role", "t-tinct-router")
    assert (router_role["metadata"]["namespace"], _grants(router_role)) == ("tinct", ROUTER)
    binding = one(docs, "ClusterRoleBinding", "t-tinct-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "t-tinct-operator", "namespace": "tinct"}
    ]

    op = container(one(docs, "Deployment", "t-tinct-operator"))
    assert op["args"][:3] == ["operator", "--peering=tinct", "--liveness=http://0.0.0.0:8080/healthz"]
    assert "--lineage-root=/var/lib/tinct/lineage" in op["args"]
    assert "--metrics-port=9100" in op["args"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in op["ports"]
    assert not any(a.startswith("--namespace") for a in op["args"]), "cluster scope watches every namespace"
    assert op["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert one(docs, "Deployment", "t-tinct-operator")["spec"]["replicas"] == 1, "one Pod on the RWO volume"
    assert one(docs, "Deployment", "t-tinct-operator")["spec"]["strategy"] == {"type": "Recreate"}
    spec = one(docs, "Deployment", "t-tinct-operator")["spec"]["template"]["spec"]
    lineage = next(v for v in spec["volumes"] if v["name"] == "lineage")
    assert lineage["persistentVolumeClaim"]["claimName"] == "t-tinct-lineage"
    pvc = one(docs, "PersistentVolumeClaim", "t-tinct-lineage")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    router = one(docs, "Deployment", "t-tinct-router")
    assert "replicas" not in router["spec"], "the HPA owns the replica count"
    rc = container(router)
    assert rc["args"][:3] == ["router", "--watch", "--selector=tinct.io/routing-table=true"]
    assert "--metrics-port=9090" in rc["args"]
    assert "--workers=2" in rc["args"], "one worker per CPU of the default limit"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in rc["ports"]
    assert rc["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert rc["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # Kept in the Service while kube-proxy drops it, then the drain: a rollout loses nothing.
    assert rc["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert router["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 5 + 5
    hpa = one(docs, "HorizontalPodAutoscaler", "t-tinct-router")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "t-tinct-router"
    pdb = one(docs, "PodDisruptionBudget", "t-tinct-router")
    assert pdb["spec"]["selector"]["matchLabels"] == router["spec"]["selector"]["matchLabels"]
    svc = one(docs, "Service", "t-tinct-router")
    assert svc["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]


def test_namespaced_mode_binds_roles_in_each_watched_namespace_only(helm: Helm) -> None:
    docs = template(helm, NAMESPACED)
    (discovery,) = [d for d in by_kind(docs, "ClusterRole") if not _tenant(d)]
    assert discovery["metadata"]["name"] == "t-tinct-operator-discovery"
    assert _grants(discovery) == DISCOVERY, "cluster-wide: only reading CRDs and the namespace list"
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "t-tinct-operator", "namespace": "tinct"}
    ]
    strict = template(helm, {**NAMESPACED, "rbac.clusterDiscovery": False, "rbac.tenantRoles": False})
    assert not by_kind(strict, "ClusterRole")
    assert not by_kind(strict, "ClusterRoleBinding")
    roles = by_kind(docs, "Role")
    ops = [r for r in roles if r["metadata"]["name"] == "t-tinct-operator"]
    assert sorted(r["metadata"]["namespace"] for r in ops) == ["llm", "llm-canary"]
    for role in ops:
        assert _grants(role) == OPERATOR_NAMESPACED
    (router_role,) = [r for r in roles if r["metadata"]["name"] == "t-tinct-router"]
    assert router_role["metadata"]["namespace"] == "tinct", "tables live in the chart's namespace"
    assert _grants(router_role) == ROUTER
    (tables,) = [r for r in roles if r["metadata"]["name"] == "t-tinct-operator-tables"]
    assert (tables["metadata"]["namespace"], _grants(tables)) == ("tinct", TABLES)
    for binding in by_kind(docs, "RoleBinding"):
        (subject,) = binding["subjects"]
        assert subject["namespace"] == "tinct", "the ServiceAccounts live in the release namespace"
    op = container(one(docs, "Deployment", "t-tinct-operator"))
    assert [a for a in op["args"] if a.startswith("--namespace")] == [
        "--namespace=llm",
        "--namespace=llm-canary",
    ]
    assert "--namespace=tinct" in container(one(docs, "Deployment", "t-tinct-router"))["args"]


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaced"])
def test_keda_scaledobjects_can_be_left_out(helm: Helm, values: dict[str, Any]) -> None:
    docs = template(helm, {**values, "rbac": {"keda": False}})
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and "operator" in d["metadata"]["name"]]
    assert roles
    for role in roles:
        assert ("keda.sh", "scaledobjects") not in _grants(role)
    operator = [r for r in roles if not r["metadata"]["name"].endswith(("-tables", "-discovery"))]
    assert operator
    for role in operator:
        assert _grants(role) | {
            ("keda.sh", "scaledobjects"): OPERATOR_NAMESPACED[("keda.sh", "scaledobjects")]
        } in (
            OPERATOR_CLUSTER,
            OPERATOR_NAMESPACED,
        )


def _tenant(role: dict[str, Any]) -> bool:
    """A role for tenants, aggregated into the built-in ones (bound to no identity of the chart)."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in role["metadata"]["labels"])


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaced"])
def test_tenants_get_view_and_edit_without_status(helm: Helm, values: dict[str, Any]) -> None:
    docs = template(helm, values)
    tenant = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole") if _tenant(d)}
    assert sorted(tenant) == ["t-tinct-edit", "t-tinct-view"]
    assert _grants(tenant["t-tinct-view"]) == TENANT_VIEW
    assert _grants(tenant["t-tinct-edit"]) == TENANT_EDIT
    labels = {n: {k for k, v in r["metadata"]["labels"].items() if v == "true"} for n, r in tenant.items()}
    assert labels == {
        "t-tinct-view": {"rbac.authorization.k8s.io/aggregate-to-view"},
        "t-tinct-edit": {
            "rbac.authorization.k8s.io/aggregate-to-edit",
            "rbac.authorization.k8s.io/aggregate-to-admin",
        },
    }
    bound = {b["roleRef"]["name"] for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not bound & set(tenant), "the chart binds them to no one: Kubernetes' view/edit/admin carry them"
    assert not [
        d for d in by_kind(template(helm, {**values, "rbac.tenantRoles": False}), "ClusterRole") if _tenant(d)
    ]


def test_the_status_key_is_generated_once_and_mounted_into_the_operator(helm: Helm) -> None:
    docs = template(helm)
    secret = one(docs, "Secret", "t-tinct-status-key")
    assert set(secret["data"]) == {"key"}
    op = one(docs, "Deployment", "t-tinct-operator")
    c = container(op)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TINCT_STATUS_KEY_FILE"] == "/etc/tinct/status-key/key"
    assert {"name": "status-key", "mountPath": "/etc/tinct/status-key", "readOnly": True} in c["volumeMounts"]
    vols = {v["name"]: v for v in op["spec"]["template"]["spec"]["volumes"]}
    assert vols["status-key"]["secret"]["secretName"] == "t-tinct-status-key"
    # An existing Secret instead: none generated.
    theirs = template(helm, {"operator.statusKey.existingSecret": "shared-key"})
    assert [d["metadata"]["name"] for d in by_kind(theirs, "Secret")] == ["t-tinct-comparer-token"]
    vols = {
        v["name"]: v
        for v in one(theirs, "Deployment", "t-tinct-operator")["spec"]["template"]["spec"]["volumes"]
    }
    assert vols["status-key"]["secret"]["secretName"] == "shared-key"


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaced"])
def test_no_wildcard_anywhere_in_rbac(helm: Helm, values: dict[str, Any]) -> None:
    docs = template(helm, values)
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and not _tenant(d)]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert all("*" not in item for item in rule[field]), f"{role['metadata']['name']}: {rule}"
            assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "patch", "update", "delete"}, rule
            if rule["verbs"] and "delete" in rule["verbs"] and rule["resources"] == ["configmaps"]:
                assert role["kind"] == "Role", "standing routing tables, only in the chart's namespace"
            elif rule["verbs"] and "delete" in rule["verbs"]:
                # A release's own HPA or ScaledObject, when it switches to the other way of scaling.
                assert rule["resources"] in (["horizontalpodautoscalers"], ["scaledobjects"]), rule
        assert "secrets" not in {r for rule in role["rules"] for r in rule["resources"]}


def test_rbac_template_groups_rules_under_framework_and_application() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    body = helpers.split('define "tinct.operator.rules"')[1].split("{{- end }}\n\n")[0]
    comments = [line.strip() for line in body.splitlines() if line.strip().startswith("#")]
    assert comments
    assert all(c.startswith(("# framework:", "# application:")) for c in comments), comments


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaced"])
def test_every_pod_runs_restricted(helm: Helm, values: dict[str, Any]) -> None:
    for dep in by_kind(template(helm, values), "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        c = container(dep)
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert c["resources"]["requests"]["cpu"]
        assert c["resources"]["limits"]["memory"]
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], "a writable /tmp"


def test_router_pre_stop_sleep_can_be_turned_off(helm: Helm) -> None:
    router = one(template(helm, {"router.preStopSleepSeconds": 0}), "Deployment", "t-tinct-router")
    assert "lifecycle" not in container(router)
    assert router["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 35


def test_router_pass_through_prefixes_become_flags(helm: Helm) -> None:
    args = container(one(template(helm), "Deployment", "t-tinct-router"))["args"]
    assert not [a for a in args if a.startswith("--pass-through-prefix")], "the router's default: /v1/"
    values = {"router.passThroughPrefixes": ["/v1/", "/tokenize"]}
    args = container(one(template(helm, values), "Deployment", "t-tinct-router"))["args"]
    assert [a for a in args if a.startswith("--pass-through-prefix")] == [
        "--pass-through-prefix=/v1/",
        "--pass-through-prefix=/tokenize",
    ]


def test_routers_send_pairs_to_the_comparer_with_its_token_mounted(helm: Helm) -> None:
    values = {
        "router.shadow.comparerUrl": "http://comparer.shadow:8090",
        "router.shadow.queuePairs": 100,
        "router.shadow.maxHeldBytes": 16777216,
    }
    router = one(template(helm, values), "Deployment", "t-tinct-router")
    c = container(router)
    assert [a for a in c["args"] if a.startswith(("--comparer", "--shadow"))] == [
        "--comparer=http://comparer.shadow:8090",
        "--comparer-token-file=/var/run/tinct/comparer/token",
        "--comparer-queue=100",
        "--shadow-max-held-bytes=16777216",
    ]
    assert {"name": "comparer-token", "mountPath": "/var/run/tinct/comparer", "readOnly": True} in c[
        "volumeMounts"
    ]
    (volume,) = [v for v in router["spec"]["template"]["spec"]["volumes"] if v["name"] == "comparer-token"]
    assert volume["secret"] == {
        "secretName": "t-tinct-comparer-token",
        "items": [{"key": "token", "path": "token"}],
    }
    values["router.shadow.tokenSecret"] = {"name": "shadow-token", "key": "bearer"}
    router = one(template(helm, values), "Deployment", "t-tinct-router")
    (volume,) = [v for v in router["spec"]["template"]["spec"]["volumes"] if v["name"] == "comparer-token"]
    assert volume["secret"] == {"secretName": "shadow-token", "items": [{"key": "bearer", "path": "token"}]}
    with pytest.raises(HelmError, match="/router/shadow/comparerUrl"):
        template(helm, {"router.shadow.comparerUrl": "comparer:8090"})


def test_object_store_lineage_takes_credentials_from_a_secret(helm: Helm) -> None:
    docs = template(
        helm,
        {
            "operator.lineage.uri": "s3://lineage/tinct",
            "operator.lineage.s3Endpoint": "http://minio.storage:9000",
            "operator.lineage.credentialsSecret": "lineage-s3",
            "operator.prometheus.url": "http://prometheus.monitoring:9090",
            "operator.artifactRoots": [
                {
                    "name": "models",
                    "mountPath": "/models",
                    "volume": {"persistentVolumeClaim": {"claimName": "m"}},
                },
                {"name": "ckpt", "mountPath": "/ckpt", "volume": {"nfs": {"server": "nfs", "path": "/c"}}},
            ],
        },
    )
    assert not by_kind(docs, "PersistentVolumeClaim"), "no lineage PVC with an object-store URI"
    dep = one(docs, "Deployment", "t-tinct-operator")
    assert dep["spec"]["replicas"] == 2, "a standby replica when nothing ties the operator to a node"
    assert "strategy" not in dep["spec"]
    c = container(dep)
    assert "--lineage-root=s3://lineage/tinct" in c["args"]
    assert "--s3-endpoint=http://minio.storage:9000" in c["args"]
    assert c["envFrom"] == [{"secretRef": {"name": "lineage-s3"}}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TINCT_ARTIFACT_ROOTS"] == "/models:/ckpt"
    assert env["TINCT_PROMETHEUS_URL"] == "http://prometheus.monitoring:9090"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert mounts["/ckpt"]["readOnly"] is True
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["artifacts-ckpt"]["nfs"] == {"server": "nfs", "path": "/c"}
    assert "lineage" not in vols
    assert "--lineage-single-writer" not in c["args"]


def test_single_writer_lineage_runs_one_operator_replica(helm: Helm) -> None:
    values = {"operator.lineage.uri": "s3://lineage/tinct", "operator.lineage.singleWriter": True}
    dep = one(template(helm, values), "Deployment", "t-tinct-operator")
    assert dep["spec"]["replicas"] == 1, "no standby: it could write while the leader does"
    assert "--lineage-single-writer" in container(dep)["args"]
    proc = helm("template", "t", str(CHART), *sets({**values, "operator.replicas": 2}), check=False)
    assert proc.returncode != 0
    assert "/operator/replicas" in proc.stderr


def test_prometheus_servers_reach_the_operator_configuration(helm: Helm) -> None:
    from tinct.operator.settings import OperatorConfig

    def env_of(values: dict[str, Any]) -> dict[str, str]:
        c = container(one(template(helm, values), "Deployment", "t-tinct-operator"))
        return {e["name"]: e["value"] for e in c["env"] if "value" in e}

    env = env_of(
        {
            "operator.prometheus.url": "http://prometheus-operated.monitoring:9090",
            "operator.prometheus.named": {
                "fleet-b": "https://prometheus.fleet-b:9090/prom",
                "edge": "http://10.0.0.7:9090",
            },
            "operator.prometheus.timeout": 2.5,
        }
    )
    assert env["TINCT_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring:9090"
    assert env["TINCT_PROMETHEUS"] == "edge=http://10.0.0.7:9090,fleet-b=https://prometheus.fleet-b:9090/prom"
    config = OperatorConfig.from_env(env)
    assert config.prometheus_url == "http://prometheus-operated.monitoring:9090"
    assert dict(config.prometheus) == {
        "edge": "http://10.0.0.7:9090",
        "fleet-b": "https://prometheus.fleet-b:9090/prom",
    }
    assert config.prometheus_timeout == 2.5
    defaults = env_of({})
    assert "TINCT_PROMETHEUS_URL" not in defaults, "no default Prometheus unless one is given"
    assert "TINCT_PROMETHEUS" not in defaults
    assert OperatorConfig.from_env(defaults).prometheus_timeout == 5


def test_notifiers_reach_the_operator_with_secret_urls_kept_in_their_secret(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinct.operator.settings import OperatorConfig

    c = container(
        one(
            template(
                helm,
                {
                    "operator.notifiers": {
                        "audit": {"type": "cloudevents", "url": "http://broker.knative-eventing/ns/default"},
                        "team-chat": {"type": "slack", "urlSecret": {"name": "team-hooks", "key": "url"}},
                    }
                },
            ),
            "Deployment",
            "t-tinct-operator",
        )
    )
    env = {e["name"]: e for e in c["env"]}
    assert env["TINCT_NOTIFIERS"]["value"] == (
        "audit=cloudevents:http://broker.knative-eventing/ns/default,team-chat=slack:env:TINCT_NOTIFIER_URL_TEAM_CHAT"
    )
    assert env["TINCT_NOTIFIER_URL_TEAM_CHAT"]["valueFrom"] == {
        "secretKeyRef": {"name": "team-hooks", "key": "url"}
    }
    # What the kubelet hands the operator parses to the same two webhooks.
    monkeypatch.setenv("TINCT_NOTIFIER_URL_TEAM_CHAT", "https://hooks/x")  # what the kubelet sets
    config = OperatorConfig.from_env({"TINCT_NOTIFIERS": env["TINCT_NOTIFIERS"]["value"]})
    assert [(n.name, n.kind, n.url) for n in config.notifiers] == [
        ("audit", "cloudevents", "http://broker.knative-eventing/ns/default"),
        ("team-chat", "slack", "https://hooks/x"),
    ]
    with pytest.raises(HelmError, match="value must be one of 'json', 'slack', 'cloudevents'"):
        template(helm, {"operator.notifiers": {"bad": {"type": "teams", "url": "http://x"}}})
    assert "TINCT_NOTIFIERS" not in {
        e["name"] for e in container(one(template(helm, {}), "Deployment", "t-tinct-operator"))["env"]
    }


def _scraped(docs: list[dict[str, Any]], component: str, port: int) -> dict[str, Any]:
    """Assert that the ServiceMonitor of ``component`` picks its metrics Service alone, which
    reaches the Pods of its Deployment on ``port``; the ServiceMonitor."""
    monitor = one(docs, "ServiceMonitor", f"t-tinct-{component}")
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = [d for d in by_kind(docs, "Service") if wanted <= d["metadata"]["labels"].items()]
    assert [d["metadata"]["name"] for d in selected] == [f"t-tinct-{component}-metrics"]
    deployment = one(docs, "Deployment", f"t-tinct-{component}")
    assert selected[0]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert selected[0]["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
    ]
    return monitor


def test_optional_servicemonitor_and_networkpolicy(helm: Helm) -> None:
    docs = template(
        helm,
        {
            "serviceMonitor.enabled": True,
            "serviceMonitor.labels": {"release": "prom"},
            "networkPolicy.enabled": True,
            "networkPolicy.routerFrom": [{"namespaceSelector": {"matchLabels": {"gateway": "true"}}}],
        },
    )
    # The ServiceMonitor picks the metrics Service alone, which reaches the router Pods'
    # metrics port; the client-facing Service does not carry it.
    sm = _scraped(docs, "router", 9090)
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert [p["name"] for p in one(docs, "Service", "t-tinct-router")["spec"]["ports"]] == ["http"]
    router_np = one(docs, "NetworkPolicy", "t-tinct-router")
    proxy_rule, metrics_rule = router_np["spec"]["ingress"]
    assert proxy_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert proxy_rule["from"] == [{"namespaceSelector": {"matchLabels": {"gateway": "true"}}}]
    assert metrics_rule == {"ports": [{"port": "metrics", "protocol": "TCP"}]}, "probes and Prometheus"
    assert one(docs, "NetworkPolicy", "t-tinct-operator")["spec"]["policyTypes"] == ["Ingress"]


def test_dashboard_alerts_and_operator_scraping_are_optional(helm: Helm) -> None:
    import json

    off = template(helm, {})
    assert not [d for d in off if d["kind"] in ("PrometheusRule", "ServiceMonitor")]
    assert not [
        d for d in by_kind(off, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})
    ]
    docs = template(
        helm,
        {
            "grafanaDashboard.enabled": True,
            "grafanaDashboard.annotations": {"grafana_folder": "tinct"},
            "prometheusRule.enabled": True,
            "prometheusRule.labels": {"release": "prom"},
            "serviceMonitor.enabled": True,
        },
    )
    cm = one(docs, "ConfigMap", "t-tinct-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "tinct"}
    assert json.loads(cm["data"]["tinct-releases.json"]) == json.loads(
        (CHART / "dashboards" / "tinct.json").read_text()
    )
    rule = one(docs, "PrometheusRule", "t-tinct")
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load((CHART / "dashboards" / "rules.yaml").read_text())
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} >= {
        "TinctReleaseRolledBack",
        "TinctReleaseStuck",
        "TinctRouterStaleTable",
    }
    # The operator is scraped too: a ServiceMonitor picking a metrics Service of the operator's Pods.
    _scraped(docs, "operator", 9100)
    operator = one(docs, "Deployment", "t-tinct-operator")
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container(operator)["ports"]


def test_crds_enabled_renders_the_chart_crds_with_keep(helm: Helm) -> None:
    docs = by_kind(template(helm, {"crds.enabled": True}), "CustomResourceDefinition")
    files = [
        d for p in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d
    ]
    assert sorted(d["metadata"]["name"] for d in docs) == sorted(d["metadata"]["name"] for d in files)
    assert {"modelversions.tinct.io", "grayreleases.tinct.io", "kopfpeerings.kopf.dev"} <= {
        d["metadata"]["name"] for d in docs
    }
    by_name = {d["metadata"]["name"]: d for d in files}
    for crd in docs:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert crd["spec"] == by_name[crd["metadata"]["name"]]["spec"], "the same schema as crds/"
    for generated in CRDS.glob("*.yaml"):
        assert (CHART / "crds" / generated.name).read_text() == generated.read_text()
    unkept = by_kind(template(helm, {"crds.enabled": True, "crds.keep": False}), "CustomResourceDefinition")
    assert all("helm.sh/resource-policy" not in (d["metadata"].get("annotations") or {}) for d in unkept)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scope": "everywhere"}, "/scope"),
        ({"operator.replicas": 0}, "/operator/replicas"),
        ({"operator.lineage.uri": "http://not-an-object-store"}, "/operator/lineage/uri"),
        ({"operator.securityContext.allowPrivilegeEscalation": True}, "/operator/securityContext"),
        ({"router.podSecurityContext.runAsNonRoot": False}, "/router/podSecurityContext"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"router.autoscaling.maxReplica": 3}, "maxReplica"),
        ({"router.workers": 0}, "/router/workers"),
        ({"router.metricsPort": 70000}, "/router/metricsPort"),
        ({"router.passThroughPrefixes": ["v1/"]}, "/router/passThroughPrefixes/0"),
        ({"router.passThroughPrefixes": ["/v1/%2e/"]}, "/router/passThroughPrefixes/0"),
        ({"operator.prometheus.url": "prometheus:9090"}, "/operator/prometheus/url"),
        # helm's validator names a bad key, though not where it is.
        ({"operator.prometheus.named": {"Fleet_B": "http://p:9090"}}, "invalid propertyName 'Fleet_B'"),
        ({"operator.prometheus.named": {"default": "http://p:9090"}}, "invalid propertyName 'default'"),
        ({"operator.prometheus.named": {"b": "http://p:9090,c=http://q"}}, "/operator/prometheus/named/b"),
        ({"operator.prometheus.timeout": 0}, "/operator/prometheus/timeout"),
        ({"comparer.judges": {"local": {"url": "judge:8000"}}}, "/comparer/judges/local/url"),
        ({"comparer.port": 0}, "/comparer/port"),
    ],
)
def test_schema_refuses_bad_values_and_names_them(helm: Helm, values: dict[str, Any], message: str) -> None:
    proc = helm("template", "t", str(CHART), *sets(values), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "workers"),
    [
        ({"router.resources.limits.cpu": "1500m"}, "--workers=2"),
        ({"router.resources.limits.cpu": "250m"}, "--workers=1"),
        ({"router.resources.limits.cpu": 4}, "--workers=4"),
        ({"router.resources.limits.cpu": "0.5"}, "--workers=1"),
        ({"router.resources.limits.cpu": "4", "router.workers": 3}, "--workers=3"),
        ({"router.resources.limits.cpu": None}, None),
    ],
)
def test_router_workers_follow_the_cpu_limit(helm: Helm, values: dict[str, Any], workers: str | None) -> None:
    args = container(one(template(helm, values), "Deployment", "t-tinct-router"))["args"]
    assert [a for a in args if a.startswith("--workers")] == ([workers] if workers else []), (
        "no limit: tinct router reads the container's CPU quota itself"
    )


def test_metrics_port_must_differ_from_the_proxy_port(helm: Helm) -> None:
    proc = helm("template", "t", str(CHART), *sets({"router.metricsPort": 8080}), check=False)
    assert proc.returncode != 0
    assert "router.metricsPort (8080) must differ from router.port" in proc.stderr


def test_autoscaling_bounds_are_checked(helm: Helm) -> None:
    bad = {"router.autoscaling.minReplicas": 5, "router.autoscaling.maxReplicas": 2}
    proc = helm("template", "t", str(CHART), *sets(bad), check=False)
    assert proc.returncode != 0
    assert (
        "router.autoscaling.minReplicas (5) must not exceed router.autoscaling.maxReplicas (2)" in proc.stderr
    )


def test_every_value_is_commented() -> None:
    """Each leaf value has a comment right above it, or sits in a block that has one."""
    stack: list[tuple[int, bool]] = []  # (indent, commented) of the enclosing keys
    previous = ""
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            previous = stripped
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        commented = previous.startswith("#") or any(c for _, c in stack)
        if stripped.endswith(":"):
            stack.append((indent, commented))
        else:
            assert commented, f"values.yaml:{number} has no comment: {line!r}"
        previous = stripped


def test_the_comparer_runs_beside_the_operator_with_its_token_service_and_judges(helm: Helm) -> None:
    docs = template(
        helm,
        {
            "comparer": {
                "judges": {
                    "local": {"url": "http://judge.llm:8000/v1"},
                    "team-b": {
                        "url": "https://judge.example/v1",
                        "apiKeySecret": {"name": "keys", "key": "b"},
                    },
                }
            },
            "serviceMonitor": {"enabled": True},
            "networkPolicy": {"enabled": True},
        },
    )
    operator = one(docs, "Deployment", "t-tinct-operator")
    cmp = container(operator, "comparer")
    assert cmp["args"][:4] == ["comparer", "--watch", "--namespace=tinct", "--port=8090"]
    assert "--comparer-token-file=/var/run/tinct/comparer/token" in cmp["args"]
    assert "--lineage-root=/var/lib/tinct/lineage" in cmp["args"]
    assert {"--judge=local=http://judge.llm:8000/v1", "--judge=team-b=https://judge.example/v1"} <= set(
        cmp["args"]
    )
    key = next(e for e in cmp["env"] if e["name"] == "TINCT_JUDGE_API_KEY_TEAM_B")
    assert key["valueFrom"] == {"secretKeyRef": {"name": "keys", "key": "b"}}
    assert cmp["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "comparer"}
    mounts = {m["name"]: m["mountPath"] for m in cmp["volumeMounts"]}
    assert mounts["lineage"] == "/var/lib/tinct/lineage", (
        "it writes shadow_pairs beside the operator's tables"
    )
    spec = operator["spec"]["template"]["spec"]
    token = next(v for v in spec["volumes"] if v["name"] == "comparer-token")
    assert token["secret"]["secretName"] == "t-tinct-comparer-token"
    secret = one(docs, "Secret", "t-tinct-comparer-token")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["token"]) > 40
    svc = one(docs, "Service", "t-tinct-comparer")
    assert svc["spec"]["selector"] == operator["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [
        {"name": "comparer", "port": 8090, "targetPort": "comparer", "protocol": "TCP"}
    ]
    monitor = one(docs, "ServiceMonitor", "t-tinct-comparer")
    assert monitor["spec"]["endpoints"][0]["port"] == "comparer"
    policy = one(docs, "NetworkPolicy", "t-tinct-operator")
    assert {"port": "comparer", "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]


def test_the_comparer_can_use_a_given_token_secret_or_be_left_out(helm: Helm) -> None:
    docs = template(helm, {"comparer": {"tokenSecret": {"name": "mine", "key": "k"}}})
    assert [d["metadata"]["name"] for d in by_kind(docs, "Secret")] == ["t-tinct-status-key"]
    spec = one(docs, "Deployment", "t-tinct-operator")["spec"]["template"]["spec"]
    token = next(v for v in spec["volumes"] if v["name"] == "comparer-token")
    assert token["secret"] == {"secretName": "mine", "items": [{"key": "k", "path": "token"}]}
    docs = template(helm, {"comparer": {"enabled": False}})
    operator = one(docs, "Deployment", "t-tinct-operator")
    assert [c["name"] for c in operator["spec"]["template"]["spec"]["containers"]] == ["operator"]
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "t-tinct-comparer"]


def test_allowed_backends_and_model_owners_reach_the_operator_and_the_routers_alike(helm: Helm) -> None:
    from tinct.operator.settings import OperatorConfig

    allowed = ["api.example.com", "*.shared.svc.cluster.local", "10.20.0.0/16"]
    owners = {"llama3-8b": "llm", "coder-7b": "code"}
    docs = template(helm, {"allowBackends": allowed, "clusterDomain": "corp.internal", "modelOwners": owners})
    for name in ("t-tinct-operator", "t-tinct-router"):
        args = container(one(docs, "Deployment", name))["args"]
        assert [a for a in args if a.startswith("--allow-backend")] == [
            f"--allow-backend={a}" for a in allowed
        ]
        assert "--cluster-domain=corp.internal" in args
        assert [a for a in args if a.startswith("--model-owner")] == [
            "--model-owner=coder-7b=code",
            "--model-owner=llama3-8b=llm",
        ]
    comparer = container(one(docs, "Deployment", "t-tinct-operator"), "comparer")["args"]
    assert [a for a in comparer if a.startswith(("--allow-backend", "--cluster-domain"))] == [
        "--cluster-domain=corp.internal",
        *(f"--allow-backend={a}" for a in allowed),
    ], "the comparer follows the tables the routers follow"
    config = OperatorConfig().with_flags({"allow_backends": allowed})
    assert config.backends.refusal("http://x.shared.svc.cluster.local:80", "llm") is None
    defaults = template(helm, {})
    for name in ("t-tinct-operator", "t-tinct-router"):
        args = container(one(defaults, "Deployment", name))["args"]
        assert not [a for a in args if a.startswith("--allow-backend")], "by default: each namespace's own"
        assert "--cluster-domain=cluster.local" in args

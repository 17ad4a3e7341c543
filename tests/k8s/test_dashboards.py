"""The chart's Grafana dashboard and alerting rules hold against a real Prometheus scraping a
real router, the operator and the comparer through a release that mirrors a cell, steps
forward, falls back, ejects its candidate and rolls back: every dashboard expression parses
and returns series, and every alert rule loads, evaluates without error, and selects series
that exist."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tinct_testing.chart_helpers import CHART
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.release_cluster import apply, backends, example, get, operator, wait_release
from tinct_testing.release_traffic import LONG_ADMIN_HIGH_STREAMED, MEDIUM_AUDIT_LOW, Background, router
from tinct_testing.shadow_helpers import Mirrored, PairPump, comparer
from tinct_testing.wait import eventually

DASHBOARD = CHART / "dashboards" / "tinct.json"
RULES = CHART / "dashboards" / "rules.yaml"


def dashboard_queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable of a dashboard."""
    for panel in doc["panels"]:
        for t in panel.get("targets", []):
            yield f"panel {panel['title']!r} {t['refId']}", t["expr"]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), *\w+\)", var["definition"])
            assert m, f"variable {var['name']}: {var['definition']}"
            yield f"variable {var['name']}", m.group(1)


def grafana(expr: str, namespace: str) -> str:
    """The expression as Grafana sends it for this namespace and every release."""
    return expr.replace("$namespace", namespace).replace("$release", ".*").replace("$__rate_interval", "1m")


def selectors(tree: Any) -> Iterator[str]:
    """Each vector or matrix selector of a parsed expression, as an instant selector."""
    if isinstance(tree, dict):
        if tree.get("type") in ("vectorSelector", "matrixSelector"):
            matchers = ",".join(f"{m['name']}{m['type']}{json.dumps(m['value'])}" for m in tree["matchers"])
            yield "{" + matchers + "}"
        for value in tree.values():
            yield from selectors(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from selectors(item)


def test_every_query_of_the_dashboard_and_the_alerts_returns_series(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    schedulers = Engines()  # emulated engines: streamed answers give the token timings
    metrics_port = free_port()
    try:
        with (
            router(ns, tmp_path / "router.log") as r,
            comparer(ns, tmp_path / "comparer.log", tmp_path / "lineage") as c,
        ):
            prom = prometheus(rule_files=[RULES])
            prom.set_targets([f"127.0.0.1:{r.port}", f"127.0.0.1:{metrics_port}", f"127.0.0.1:{c.port}"])

            def uid() -> str | None:
                obj = get(cluster, ns, "grayrelease", "chat")
                return None if obj is None else str(obj["metadata"]["uid"])

            # Pairs of the default cell, mirrored as a router would, once the release exists.
            mirrored = [Mirrored("len:medium+role:audit+latency:low", "a question")]
            with (
                operator(
                    ns,
                    tmp_path / "lineage",
                    TINCT_METRICS_PORT=str(metrics_port),
                    TINCT_PROMETHEUS_URL=prom.url,
                    # A webhook nobody answers: its notifications fail, and are counted.
                    TINCT_NOTIFIERS=f"nobody=json:http://127.0.0.1:{free_port()}/hook",
                    TINCT_NOTIFY_ATTEMPTS="2",
                    TINCT_NOTIFY_BACKOFF="0.1",
                ),
                Background(r.port, [LONG_ADMIN_HIGH_STREAMED, MEDIUM_AUDIT_LOW]),
                PairPump(c, schedulers.v1.url, schedulers.v2.url, mirrored, uid, ns, noise_every=2),
            ):
                doc = example(
                    analysis={
                        "interval": "4s",
                        "failureLimit": 2,
                        "minRequests": 5,
                        "metrics": [
                            {"name": "success-rate", "min": 95},
                            {"name": "latency-p95", "maxMs": 800},
                        ],
                    },
                    fallback={"consecutiveFailures": 3, "cooldownSeconds": 1},
                    notify=[{"name": "nobody"}],
                )
                doc["spec"]["stable"]["url"] = schedulers.v1.url
                doc["spec"]["candidate"]["url"] = schedulers.v2.url
                doc["spec"]["cells"][2]["shadow"] = [10, 10, 10, 0]  # the default cell mirrors
                apply(cluster, ns, doc)

                # Healthy: the candidate serves its share and the analysis passes a step.
                wait_release(cluster, ns, lambda s: s.get("step", 0) >= 1, "step 2/4", timeout=180)
                # Then failing: fallbacks, ejections, failed analyses, the rollback.
                schedulers.set(schedulers.v2, error_rate=1.0)
                wait_release(cluster, ns, lambda s: s.get("phase") == "RolledBack", "RolledBack", timeout=180)
                prom.wait_for(f'tinct_release_phase{{namespace="{ns}",phase="RolledBack"}} == 1', timeout=60)
                prom.wait_for(f'tinct_router_candidate_ejections_total{{namespace="{ns}"}}', timeout=60)
                prom.wait_for('tinct_release_notifications_total{result="failed"}', timeout=60)
                # The comparer counted the mirroring cell's pairs while its table mirrored; its
                # counters stay exported after the rollback, when no cell mirrors any more.
                for target in ("candidate", "stable"):
                    prom.wait_for(
                        f'tinct_shadow_pairs_total{{namespace="{ns}",target="{target}"}}', timeout=60
                    )

                dash = json.loads(DASHBOARD.read_text())
                assert any("tinct_shadow_" in e for _, e in dashboard_queries(dash)), "a shadow panel"
                empty = []
                for where, expr in dashboard_queries(dash):
                    promql = grafana(expr, ns)
                    prom.parse(promql)  # raises with Prometheus's message when it does not parse
                    if not prom.query(promql):
                        empty.append(f"{where}: {promql}")
                assert empty == [], "dashboard queries without series:\n" + "\n".join(empty)

                rules = yaml.safe_load(RULES.read_text())["groups"]
                missing = []
                for group in rules:
                    for rule in group["rules"]:
                        for sel in set(selectors(prom.parse(rule["expr"]))):
                            if not prom.query(sel):
                                missing.append(f"{rule['alert']}: {sel}")
                assert missing == [], "alert selectors without series:\n" + "\n".join(missing)

                def evaluated() -> list[dict[str, Any]] | None:
                    loaded = [rule for g in prom.rule_groups() for rule in g["rules"]]
                    done = len(loaded) == sum(len(g["rules"]) for g in rules) and all(
                        x.get("lastEvaluation", "").startswith("2")
                        and not x["lastEvaluation"].startswith("0001")
                        for x in loaded
                    )
                    return loaded if done else None

                loaded = eventually(evaluated, timeout=60, what="every rule evaluated once")
                assert {x["name"]: (x["health"], x.get("lastError", "")) for x in loaded} == {
                    rule["alert"]: ("ok", "") for g in rules for rule in g["rules"]
                }
                firing = eventually(
                    lambda: (
                        [
                            a
                            for x in prom.rule_groups()
                            for rule in x["rules"]
                            if rule["name"] == "TinctReleaseRolledBack"
                            for a in rule.get("alerts", [])
                            if a["labels"].get("namespace") == ns
                        ]
                        or None
                    ),
                    timeout=60,
                    what="TinctReleaseRolledBack firing",
                )
                assert firing[0]["labels"]["release"] == "chat"
    finally:
        schedulers.stop()

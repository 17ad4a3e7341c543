"""Releases judged by a real Prometheus scraping a real router, with the operator running.

The router (`tinct router --watch`) follows the table the operator writes and proxies to the
v1/v2 emulated engines (tinct emulator); Prometheus scrapes the router every second; the operator queries it each
interval. Shares are checked request by request: every session must land where the sticky
hash and the weight in force say, and the share per cell stays within the binomial spread.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from tinct.api.routing import parse_table
from tinct.router.choose import point
from tinct.router.table import CompiledTable
from tinct_testing import release_stack
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.release_cluster import (
    LOOPBACK,
    MODULES,
    apply,
    backends,
    condition,
    events,
    example,
    get,
    history,
    in_phase,
    release_status,
    table,
    wait_history_written,
)
from tinct_testing.release_traffic import (
    LONG_ADMIN_HIGH,
    MEDIUM_AUDIT_LOW,
    STREAMED,
    Background,
    CellTraffic,
    burst,
    router,
)
from tinct_testing.wait import WAIT, eventually

LONG = "len:long+role:admin+latency:high"
DEFAULT = "len:*+role:*+latency:*"
CELLS = [
    {"match": {"promptLength": "long", "role": "admin", "latency": "high"}, "weights": [20, 50, 100]},
    {"match": {}, "weights": [10, 30, 100]},
]
BUCKET = {LONG_ADMIN_HIGH: ("long", "admin", "high"), MEDIUM_AUDIT_LOW: ("medium", "audit", "low")}


class Stack(release_stack.Stack):
    """The router scraped; releases of the example with :data:`CELLS`, judged on it."""

    def release(self, **kw: Any) -> dict[str, Any]:
        analysis = {
            "interval": kw.pop("interval", "6s"),
            "failureLimit": kw.pop("failureLimit", 2),
            "minRequests": kw.pop("minRequests", 5),
            "perCell": kw.pop("perCell", False),
            "prometheus": {"url": self.prometheus.url},
            "metrics": kw.pop(
                "metrics", [{"name": "success-rate", "min": 95}, {"name": "latency-p95", "maxMs": 800}]
            ),
        }
        doc = example(analysis=analysis, cells=CELLS, autoscaling={"minReplicas": 1, "maxReplicas": 10}, **kw)
        doc["spec"]["stable"]["url"] = self.engines.v1.url
        doc["spec"]["candidate"]["url"] = self.engines.v2.url
        return doc

    def table(self) -> dict[str, Any]:
        got = table(self.cluster, self.ns)
        assert got is not None
        return got[1]

    def hpa(self, side: str) -> tuple[int, int] | None:
        hpa = get(self.cluster, self.ns, "hpa", f"tinct-chat-{side}")
        return None if hpa is None else (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])


@pytest.fixture
def stack(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> Iterator[Stack]:
    with Stack.running(cluster, namespace, tmp_path, prometheus) as s:
        yield s


def _check_shares(
    stack: Stack, table_doc: dict[str, Any], label: str, n: int = 200, held: Callable[[], bool] = lambda: True
) -> dict[str, float] | None:
    """Send ``n`` sessions per cell; each must land where the table says. Returns the shares,
    or None when ``held`` says the table did not stay in force for a burst (the release moved
    on meanwhile: on a loaded machine a burst may outlast a step)."""
    compiled = CompiledTable(parse_table(json.dumps(table_doc)))
    shares: dict[str, float] = {}
    for cell in (LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW):
        route = compiled.routes[BUCKET[cell]]
        got = burst(stack.router.port, cell, f"{label}-{cell.role}", n)
        if not held():
            return None
        want = {
            s: ("v2" if route.weight > 0 and point(compiled, s.encode()) < route.weight else "v1")
            for s in got
        }
        assert got == want, f"{label}: sessions landed off the table's weights"
        share = 100.0 * sum(1 for side in got.values() if side == "v2") / n
        spread = 4.5 * math.sqrt(route.weight * (100 - route.weight) / n)
        assert abs(share - route.weight) <= spread + 1e-9, (label, cell, share, route.weight)
        shares[route.tag] = share
    return shares


def _warnings_with(stack: Stack, reason: str) -> list[dict[str, Any]] | None:
    warnings = [e for e in events(stack.cluster, stack.ns) if e["type"] == "Warning"]
    return warnings if any(e["reason"] == reason for e in warnings) else None


def _in_force(stack: Stack, version: int) -> bool:
    return stack.router.table_version() == version


def test_healthy_candidate_steps_to_promoted_with_router_shares_matching(stack: Stack) -> None:
    checked: dict[int, tuple[dict[str, float], tuple[int, int] | None]] = {}
    with stack.operator(), Background(stack.router.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]):
        apply(stack.cluster, stack.ns, stack.release())

        def promoted() -> bool:
            st = stack.status()
            if st.get("phase") == "Progressing" and st.get("step") not in checked and st.get("routing"):
                version = st["routing"]["version"]
                eventually(lambda: _in_force(stack, version), timeout=30, what="the router on the new table")
                table = stack.table()
                if table["version"] == version:
                    held = lambda: _in_force(stack, version)  # noqa: E731
                    shares = _check_shares(stack, table, f"step{st['step']}", held=held)
                    if shares is not None:  # the table held during the bursts
                        checked[st["step"]] = (shares, stack.hpa("candidate"))
            return st.get("phase") == "Promoted"

        eventually(promoted, timeout=240, what="Promoted")
        st = stack.status()
        final = stack.table()
        eventually(
            lambda: _in_force(stack, final["version"]), timeout=30, what="the router on the final table"
        )
        after = _check_shares(stack, final, "promoted")
        assert after is not None
        hpas = (stack.hpa("stable"), stack.hpa("candidate"))
        wait_history_written(stack.cluster, stack.ns)
    assert sorted(checked) == [0, 1], checked
    assert checked[0][1] == (1, 2)  # 20% at most in any cell: ceil(10 * 0.2)
    assert checked[1][1] == (1, 5)
    assert set(after.values()) == {100.0}
    assert hpas[1] == (1, 10)
    assert st["failedAnalyses"] == 0
    by = {m["name"]: m for m in st["lastAnalysis"]["metrics"]}
    assert by["success-rate"]["verdict"] == "Pass"
    assert by["success-rate"]["value"] == pytest.approx(100.0)
    assert by["latency-p95"]["value"] < 800
    rows = history(stack.root)
    assert [(r["reason"].split(":")[0], r["state"], r["step"]) for r in rows] == [
        ("Started", "Progressing", 1),
        ("StepAdvanced", "Progressing", 2),
        ("Promoted", "Promoted", 3),
    ]
    assert dict(rows[1]["metrics"])["success-rate"] == pytest.approx(100.0)


def test_candidate_answering_5xx_is_rolled_back(stack: Stack) -> None:
    stack.engines.set(stack.engines.v2, error_rate=1)
    with (
        stack.operator(),
        Background(stack.router.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]) as bg,
    ):
        # Every request tried on the candidate: each window judges its answers (with ejections, a
        # window shorter than the cooldown may see the candidate untried and say nothing).
        fallback = {"consecutiveFailures": 1000, "cooldownSeconds": 0}
        apply(stack.cluster, stack.ns, stack.release(failureLimit=2, fallback=fallback))
        st = stack.in_phase("RolledBack", timeout=180)
        table = stack.table()
        eventually(
            lambda: _in_force(stack, table["version"]), timeout=30, what="the router on the rollback table"
        )
        stack.engines.set(stack.engines.v2, error_rate=0)  # healthy again: still nothing goes there
        after = burst(stack.router.port, LONG_ADMIN_HIGH, "after", 100)
        candidate_hpa = stack.hpa("candidate")
        warnings = eventually(
            lambda: _warnings_with(stack, "RolledBack"), timeout=WAIT, what="the RolledBack event"
        )
        wait_history_written(stack.cluster, stack.ns)
    assert bg.answered.get(("v1", "upstream_error"), 0) > 0
    assert {c["weight"] for c in table["cells"]} == {0}
    assert set(after.values()) == {"v1"}
    assert (st["step"], st["failedAnalyses"]) == (0, 2)
    assert "rolled back at step 1/3 after 2 failed analyses" in st["message"]
    assert "success-rate" in st["message"]
    assert candidate_hpa == (1, 2), "right after a rollback the candidate keeps its bounds a while"
    assert condition(st, "AnalysisPassing")["status"] == "False"
    assert [(r["reason"].split(":")[0], r["state"]) for r in history(stack.root)] == [
        ("Started", "Progressing"),
        ("RolledBack", "RolledBack"),
    ]
    assert [e["reason"] for e in warnings].count("AnalysisFailed") == 1


def test_slow_candidate_falls_back_per_request_and_fails_on_latency(stack: Stack) -> None:
    stack.engines.set(stack.engines.v2, head_delay_ms=60_000)
    with (
        stack.operator(),
        Background(stack.router.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]) as bg,
    ):
        doc = stack.release(
            failureLimit=1,
            metrics=[{"name": "latency-p95", "maxMs": 300}],
            fallback={"latencyMs": 300, "consecutiveFailures": 1000, "cooldownSeconds": 0},
        )
        apply(stack.cluster, stack.ns, doc)
        st = stack.in_phase("RolledBack", timeout=180)
    assert bg.answered.get(("v1", "latency_too_high"), 0) > 0
    lat = st["lastAnalysis"]["metrics"][0]
    assert (lat["name"], lat["verdict"]) == ("latency-p95", "Fail")
    assert lat["value"] >= 300
    assert "fell back at the latency limit" in lat["message"]


def test_prometheus_stopped_holds_inconclusive_then_resumes(stack: Stack) -> None:
    # Only the default cell gets traffic: the long/admin/high cell is inconclusive, not failed.
    with stack.operator(), Background(stack.router.port, [MEDIUM_AUDIT_LOW]):
        apply(stack.cluster, stack.ns, stack.release(perCell=True, interval="5s"))
        st = stack.wait(
            lambda s: s.get("step") == 1 and (s.get("routing") or {}).get("confirmedAt"),
            "step 2/3 served by the router",
            timeout=120,
        )
        cells = {c["cell"]: c for c in st["lastAnalysis"]["cells"]}
        assert cells[LONG]["verdict"] == "Inconclusive"
        assert cells[DEFAULT]["verdict"] == "Pass"
        assert st["lastAnalysis"]["verdict"] == "Pass"

        stack.prometheus.stop()
        try:
            held = stack.wait(
                lambda s: s.get("inconclusiveAnalyses", 0) >= 2,
                "two inconclusive analyses",
                timeout=120,
            )
        finally:
            stack.prometheus.start()
        cond = condition(held, "AnalysisPassing")
        assert (cond["status"], cond["reason"]) == ("Unknown", "Inconclusive")
        assert 'Prometheus "default" could not be reached' in cond["message"]
        assert (held["phase"], held["step"], held["failedAnalyses"]) == ("Progressing", 1, 0)
        done = stack.in_phase("Promoted", timeout=180)
    assert done["failedAnalyses"] == 0
    assert done["inconclusiveAnalyses"] == 0


def test_a_candidate_that_dies_mid_stream_is_rolled_back(stack: Stack) -> None:
    """A stream cut after its headers is a failure of the side that cut it: with the old
    count (a 200 is a success) this candidate read 100 %."""
    stack.engines.set(stack.engines.v2, cut_after_tokens=1)
    with stack.operator(), Background(stack.router.port, [STREAMED]) as bg:
        apply(
            stack.cluster,
            stack.ns,
            stack.release(failureLimit=1, metrics=[{"name": "success-rate", "min": 95}]),
        )
        st = stack.in_phase("RolledBack", timeout=180)
    assert bg.answered.get(("v2", "truncated"), 0) > 0, (
        "the candidate's answers started as 200s, then were cut"
    )
    sr = st["lastAnalysis"]["metrics"][0]
    assert (sr["name"], sr["verdict"]) == ("success-rate", "Fail")
    assert sr["value"] < 95
    assert "tinct_router_truncated_responses_total" in stack.router.metrics()


def test_a_step_is_judged_only_once_every_router_serves_its_table(
    stack: Stack, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> None:
    """A second router that never follows the tables (it reads a file of the first version)
    keeps the lowest served version back: the step's window does not start, the release
    holds and says why; once that router goes, the release goes on."""
    from tinct_testing.router_fakes import router_argv

    with stack.operator(), Background(stack.router.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]):
        apply(stack.cluster, stack.ns, stack.release(interval="3s"))
        first = stack.wait(lambda s: (s.get("routing") or {}).get("confirmedAt"), "confirmed")
        frozen = tmp_path / "frozen.json"
        got = table(stack.cluster, stack.ns)
        assert got is not None
        frozen_version, doc = got
        frozen.write_text(json.dumps(doc))
        # Paused while the stale router comes up and is scraped: on a loaded machine the
        # 3 s window could otherwise pass, and the next table be confirmed, before it is seen.
        paused = '{"spec": {"paused": %s}}'
        stack.cluster.kubectl(
            "patch", "grayrelease", "chat", "-n", stack.ns, "--type=merge", "-p", paused % "true"
        )
        stack.in_phase("Paused")
        port = free_port()
        stale = subprocess.Popen(
            router_argv(str(frozen), port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            stack.prometheus.set_targets([f"127.0.0.1:{stack.router.port}", f"127.0.0.1:{port}"], wait=True)
            stack.cluster.kubectl(
                "patch", "grayrelease", "chat", "-n", stack.ns, "--type=merge", "-p", paused % "false"
            )
            held = stack.wait(
                lambda s: (
                    "the routers have not been seen serving table version"
                    in condition(s, "Progressing")["message"]
                ),
                "held for the stale router",
                timeout=120,
            )
            time.sleep(8)  # more than two windows
            still = stack.status()
        finally:
            stale.terminate()
            stale.wait(10)
        stack.prometheus.set_targets([f"127.0.0.1:{stack.router.port}"], wait=True)
        done = stack.in_phase("Promoted", timeout=180)
    assert first["step"] == 0
    assert held["step"] == still["step"], "no window judged traffic the stale router sent by an old table"
    assert (still.get("routing") or {}).get("confirmedAt") is None
    assert f"the lowest seen is {frozen_version}" in condition(still, "Progressing")["message"]
    assert done["failedAnalyses"] == 0


def test_releases_named_alike_in_two_namespaces_never_judge_each_others_traffic(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> None:
    """One router, one table namespace, two releases called chat: the one whose candidate
    answers 5xx rolls back, the healthy one is promoted."""
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    sick, well = Engines(("sick-v1", "sick-v2")), Engines(("well-v1", "well-v2"))
    try:
        for ns in (namespace, other):
            (tmp_path / ns).mkdir()
            backends(cluster, ns, tmp_path / ns)
        sick.set(sick.v2, error_rate=1)
        with router(namespace, tmp_path / "router.log") as r:
            prom = prometheus()
            prom.set_targets([f"127.0.0.1:{r.port}"])
            env = {
                "TINCT_TABLE_NAMESPACE": namespace,
                "TINCT_PROMETHEUS_URL": prom.url,
                "TINCT_ALLOW_BACKENDS": LOOPBACK,
            }
            with patched_environ(TINCT_LINEAGE_ROOT=str(tmp_path / "lineage"), TINCT_RELEASE_TICK="0.5",
                                 TINCT_ARTIFACT_ROOTS=str(tmp_path), **env):  # fmt: skip
                args = ["run", *MODULES, "--standalone", "--namespace", namespace, "--namespace", other]
                with (
                    KopfRunner(args, timeout=60) as runner,
                    Background(r.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]),
                ):
                    for ns, s in ((namespace, sick), (other, well)):
                        no_ejection = {"consecutiveFailures": 1000, "cooldownSeconds": 0}
                        doc = Stack(cluster, ns, tmp_path, s, r, prom).release(
                            failureLimit=1, fallback=no_ejection
                        )
                        doc["spec"]["models"] = ["llama3-8b"] if ns == namespace else ["llama3-8b-b"]
                        apply(cluster, ns, doc)
                    # Traffic for the second release's model too.
                    with Background(r.port, [CellTraffic("audit", "low", 300, model="llama3-8b-b")]):
                        rolled = in_phase(cluster, namespace, "RolledBack", timeout=180)
                        promoted = in_phase(cluster, other, "Promoted", timeout=240)
                assert runner.exception is None, runner.output
    finally:
        sick.stop()
        well.stop()
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
    assert rolled["lastAnalysis"]["metrics"][0]["value"] < 95
    assert promoted["failedAnalyses"] == 0


def test_a_custom_metric_answering_inf_is_inconclusive_and_recorded(stack: Stack) -> None:
    with stack.operator(), Background(stack.router.port, [MEDIUM_AUDIT_LOW]):
        apply(
            stack.cluster,
            stack.ns,
            stack.release(metrics=[{"name": "custom", "query": "vector(+Inf)", "max": 1}], interval="3s"),
        )
        st = stack.wait(
            lambda s: s.get("inconclusiveAnalyses", 0) >= 1,
            "inconclusive",
            timeout=120,
        )
    m = st["lastAnalysis"]["metrics"][0]
    assert (m["verdict"], m.get("value")) == ("Inconclusive", None)
    assert "+Inf" in m["message"]
    assert (st["phase"], st["step"]) == ("Progressing", 0)


def test_prometheus_urls_come_from_the_operator_and_a_hanging_one_delays_nobody(stack: Stack) -> None:
    """A release naming a URL the operator does not know is refused before anything is
    fetched; one reading a Prometheus that never answers does not hold up another's rollback."""
    import socket

    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)  # accepts connections and never answers
    slow = f"http://127.0.0.1:{hang.getsockname()[1]}"
    stack.engines.set(stack.engines.v2, error_rate=1)
    try:
        with (
            stack.operator(TINCT_PROMETHEUS=f"slow={slow}", TINCT_PROMETHEUS_TIMEOUT="60"),
            Background(stack.router.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]),
        ):
            stranger = stack.release()
            stranger["metadata"]["name"] = "stranger"
            stranger["spec"]["analysis"]["prometheus"] = {"url": "http://169.254.169.254/latest"}
            stranger["spec"]["models"] = ["stranger"]
            waiting = stack.release(interval="2s")
            waiting["metadata"]["name"] = "waiting"
            waiting["spec"]["analysis"]["prometheus"] = {"name": "slow"}
            waiting["spec"]["models"] = ["waiting"]
            waiting["spec"]["analysis"]["metrics"] = [{"name": "custom", "query": "vector(1)", "max": 2}]
            apply(stack.cluster, stack.ns, stranger, waiting)
            refused = stack.wait(
                lambda s: any(c["reason"] == "PrometheusNotAllowed" for c in s.get("conditions", [])),
                "refused",
                name="stranger",
            )
            stack.in_phase("Progressing", name="waiting")
            no_ejection = {"consecutiveFailures": 1000, "cooldownSeconds": 0}
            apply(stack.cluster, stack.ns, stack.release(failureLimit=1, fallback=no_ejection))
            rolled = stack.in_phase("RolledBack", timeout=120)
            slowpoke = release_status(stack.cluster, stack.ns, "waiting")
    finally:
        hang.close()
    assert refused["phase"] == "Pending"
    assert "169.254.169.254" in condition(refused, "AnalysisReady")["message"]
    assert "use one of" in condition(refused, "AnalysisReady")["message"]
    assert rolled["failedAnalyses"] == 1
    assert slowpoke.get("lastAnalysis") is None, "its analysis is still waiting on the slow Prometheus"

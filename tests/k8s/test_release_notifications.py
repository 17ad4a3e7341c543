"""The operator posts release transitions to the webhooks a release names, against a real HTTP
receiver: a promoted release and one rolled back by its analysis (a real Prometheus scraping
a real router), in the three formats, retried, counted, and never holding a round."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.notify_receiver import Receiver, receiver
from tinct_testing.release_cluster import apply, backends, example, operator, wait_release
from tinct_testing.release_traffic import LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW, Background, Router, router
from tinct_testing.wait import WAIT, eventually


@pytest.fixture
def rec() -> Iterator[Receiver]:
    with receiver(flaky=2) as r:
        yield r


def _counter(port: int, notifier: str, result: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = f'tinct_release_notifications_total{{notifier="{notifier}",result="{result}"}} '
    return next((float(line[len(want) :]) for line in text.splitlines() if line.startswith(want)), 0.0)


def test_webhooks_hear_a_promoted_and_a_rolled_back_release(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus], rec: Receiver
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    schedulers = Engines()
    metrics_port = free_port()
    hooks = ",".join(
        [
            f"hook=json:{rec.url('/ok/json')}",
            f"team=slack:{rec.url('/ok/slack')}",
            f"bus=cloudevents:{rec.url('/flaky/ce')}",
            f"stuck=json:{rec.url('/hang/json')}",
        ]
    )
    try:
        with router(ns, tmp_path / "router.log") as r:
            prom = prometheus()
            prom.set_targets([f"127.0.0.1:{r.port}"])
            with operator(
                ns,
                tmp_path / "lineage",
                TINCT_NOTIFIERS=hooks,
                TINCT_NOTIFY_BACKOFF="0.2",
                TINCT_NOTIFY_TIMEOUT="2",
                TINCT_NOTIFY_ATTEMPTS="3",
                TINCT_METRICS_PORT=str(metrics_port),
                TINCT_PROMETHEUS_URL=prom.url,
            ):
                _promoted(cluster, ns, rec, metrics_port)
                _rolled_back(cluster, ns, rec, r, schedulers, prom)
    finally:
        schedulers.stop()


def _promoted(cluster: Cluster, ns: str, rec: Receiver, metrics_port: int) -> None:
    notify: list[dict[str, Any]] = [{"name": n} for n in ("hook", "team", "bus", "stuck", "nobody")]
    apply(cluster, ns, example(analysis={"interval": "2s"}, notify=notify))
    # The webhook that never answers holds nothing: the release steps on to its promotion.
    st = wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted", timeout=120)
    unknown = next(c for c in st["conditions"] if c["type"] == "NotificationsReady")
    assert (unknown["status"], unknown["reason"]) == ("False", "NotifierUnknown")
    assert "the operator has no notifier nobody" in unknown["message"]
    story = ["Started", "StepAdvanced", "StepAdvanced", "Promoted"]
    eventually(
        lambda: len(rec.at("/ok/json")) == 4 or None, timeout=WAIT, what="the json webhook's four transitions"
    )
    json_docs = [x.body for x in rec.at("/ok/json")]
    assert [d["reason"] for d in json_docs] == story
    assert [d["step"] for d in json_docs] == ["1/4", "2/4", "3/4", "4/4"]
    assert {(d["namespace"], d["release"]) for d in json_docs} == {(ns, "chat")}
    assert json_docs[-1]["phase"] == "Promoted"
    assert json_docs[-1]["candidateWeight"] == 100
    eventually(lambda: len(rec.at("/ok/slack")) == 4 or None, timeout=WAIT, what="the slack webhook's")
    texts = [x.body["text"] for x in rec.at("/ok/slack")]
    assert texts[-1].startswith(f"GrayRelease {ns}/chat: Promoted - promoted after step 3/4")
    # The CloudEvents receiver answered 503 twice: retried, each event delivered once, in order.
    eventually(lambda: len(rec.at("/flaky/ce")) == 4 or None, timeout=WAIT, what="the CloudEvents")
    events = list(rec.at("/flaky/ce"))
    assert [e.body["type"] for e in events] == [f"io.tinct.grayrelease.{s.lower()}" for s in story]
    assert [e.body["id"] for e in events] == [d["id"] for d in json_docs]
    assert all(e.headers["Content-Type"].startswith("application/cloudevents+json") for e in events)
    assert rec.attempts["/flaky/ce"] == 4 + 2
    # Counted in the operator's metrics.
    eventually(lambda: _counter(metrics_port, "hook", "sent") == 4 or None, timeout=WAIT, what="the counters")
    assert _counter(metrics_port, "bus", "sent") == 4
    # The webhook that never answers: three attempts time out in a row, its circuit breaker
    # opens, and its four notifications are dropped (counted) instead of queueing for minutes.
    eventually(
        lambda: _counter(metrics_port, "stuck", "dropped") == 4 or None,
        timeout=60,
        what="the hanging webhook's notifications dropped",
    )
    assert rec.attempts["/hang/json"] == 3
    cluster.kubectl("delete", "gr", "chat", "-n", ns, "--wait=true")


def _rolled_back(
    cluster: Cluster, ns: str, rec: Receiver, r: Router, schedulers: Engines, prom: Prometheus
) -> None:
    schedulers.set(schedulers.v2, error_rate=1.0)
    doc = example(
        analysis={
            "interval": "6s",
            "failureLimit": 2,
            "minRequests": 5,
            "prometheus": {"url": prom.url},
            "metrics": [{"name": "success-rate", "min": 95}],
        },
        fallback={"consecutiveFailures": 1000, "cooldownSeconds": 0},
        notify=[{"name": "hook", "on": ["RolledBack", "Promoted"]}],
    )
    doc["metadata"]["name"] = "chat-2"
    doc["spec"]["stable"]["url"] = schedulers.v1.url
    doc["spec"]["candidate"]["url"] = schedulers.v2.url
    with Background(r.port, [LONG_ADMIN_HIGH, MEDIUM_AUDIT_LOW]):
        apply(cluster, ns, doc)
        st = wait_release(
            cluster,
            ns,
            lambda s: s.get("phase") == "RolledBack",
            "chat-2 RolledBack",
            name="chat-2",
            timeout=180,
        )
    assert "after 2 failed analyses" in st["message"]

    def rolled() -> list[dict[str, Any]] | None:
        docs = [x.body for x in rec.at("/ok/json") if x.body["release"] == "chat-2"]
        return docs or None

    docs = eventually(rolled, timeout=WAIT, what="chat-2's RolledBack notification")
    assert [(d["reason"], d["phase"], d["step"]) for d in docs] == [("RolledBack", "RolledBack", "1/4")]
    assert "success-rate" in docs[0]["message"]
    assert docs[0]["candidateWeight"] == 0
    assert docs[0]["metrics"]["success-rate"] < 95

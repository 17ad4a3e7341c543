"""Webhook notifications: configuration, the three formats, delivery against a real HTTP
receiver (retries with backoff, refusals, a receiver that never answers), and the counters."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from tinct.api.v1alpha1.grayrelease import GrayRelease
from tinct.operator.grayrelease.metrics import ReleaseMetrics
from tinct.operator.grayrelease.notify import Dispatcher, parse_notifiers, payload, render
from tinct.operator.settings import OperatorConfig
from tinct_testing.notify_receiver import Receiver, receiver
from tinct_testing.release_helpers import T0, release, step
from tinct_testing.wait import eventually_async


def test_notifiers_come_from_the_configuration_only() -> None:
    found = parse_notifiers(
        "team=slack:env:TEAM_HOOK, audit=cloudevents:http://broker.knative:80/ns/default",
        {"TEAM_HOOK": "https://hooks.slack.com/services/T0/B0/secret"},
    )
    assert [(n.name, n.kind, n.url) for n in found] == [
        ("team", "slack", "https://hooks.slack.com/services/T0/B0/secret"),
        ("audit", "cloudevents", "http://broker.knative:80/ns/default"),
    ]
    assert "secret" not in repr(found)
    for bad, why in (
        ("team=teams:http://x", "type 'teams' is not one of json, slack, cloudevents"),
        ("Team=json:http://x", "'Team' is not a notifier name"),
        ("team=json:ftp://x", "team: its URL must be http(s)://host[:port][/path]"),
        ("team=json:env:NOPE", "the environment variable NOPE holding its URL is not set"),
        ("team=json:http://a,team=json:http://b", "'team' is given twice"),
        ("team", "give NAME=TYPE:URL"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_notifiers(bad, {})
    # An operator started with a bad one says which, without repeating a URL that may be a secret.
    with pytest.raises(ValueError, match=r"^TINCT_NOTIFIERS: ") as refused:
        OperatorConfig.from_env(
            {"TINCT_NOTIFIERS": "team=teams:https://hooks.slack.com/services/T0/B0/secret"}
        )
    assert "secret" not in str(refused.value)
    assert str(refused.value).startswith("TINCT_NOTIFIERS: team: type 'teams'")


def _promoted() -> GrayRelease:
    gr = release(notify=[{"name": "hook"}, {"name": "chat", "on": ["Promoted", "RolledBack"]}])
    gr = step(gr, T0)
    return step(gr, T0, actions=["promote@a1-x"])


def test_the_three_formats() -> None:
    gr = _promoted()
    assert gr.status is not None
    entry = gr.status.history[-1]
    doc = payload(gr, entry)
    assert {k: doc[k] for k in ("kind", "id", "release", "namespace", "reason", "phase", "step")} == {
        "kind": "GrayReleaseTransition",
        "id": f"uid-1/{entry.seq}",
        "release": "chat",
        "namespace": "llm",
        "reason": "Promoted",
        "phase": "Promoted",
        "step": "4/4",
    }
    assert (doc["candidateWeight"], doc["stable"], doc["candidate"]) == (
        100.0,
        "llama3-8b-1-4-0",
        "llama3-8b-2-0-0",
    )
    headers, body = render("slack", doc)
    import json

    slack = json.loads(body)
    assert slack["text"].startswith("GrayRelease llm/chat: Promoted - promoted after step 1/4")
    assert slack["attachments"][0]["color"] == "good"
    headers, body = render("cloudevents", doc)
    assert headers["Content-Type"].startswith("application/cloudevents+json")
    event = json.loads(body)
    assert {k: event[k] for k in ("specversion", "id", "type", "source", "subject")} == {
        "specversion": "1.0",
        "id": doc["id"],
        "type": "io.tinct.grayrelease.promoted",
        "source": "/apis/tinct.io/v1alpha1/namespaces/llm/grayreleases/chat",
        "subject": "chat",
    }
    assert event["data"] == doc


def _count(metrics: ReleaseMetrics, name: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "tinct_release_notifications_total", {"notifier": name, "result": result}
    )
    return value or 0.0


async def test_delivery_retries_refuses_and_never_waits_for_a_receiver() -> None:
    with receiver(flaky=2) as rec:
        await _deliver(rec)


async def _deliver(rec: Receiver) -> None:
    notifiers = parse_notifiers(
        ",".join(
            [
                f"hook=json:{rec.url('/ok/json')}",
                f"chat=slack:{rec.url('/ok/slack')}",
                f"flaky=cloudevents:{rec.url('/flaky/ce')}",
                f"gone=json:{rec.url('/gone/json')}",
                f"stuck=json:{rec.url('/hang/json')}",
            ]
        ),
        {},
    )
    metrics = ReleaseMetrics(CollectorRegistry())
    # No breaker here (a dead webhook's is below): each notification gets its attempts.
    d = Dispatcher(notifiers, metrics, timeout=1.0, attempts=4, backoff=0.05, break_after=100)
    names = ["hook", "chat", "flaky", "gone", "stuck", "nobody"]
    gr = release(notify=[{"name": n} for n in names[:2]] + [{"name": n} for n in names[2:]])
    assert d.unknown(gr) == ["nobody"]
    gr = step(gr, T0)
    gr = step(gr, T0 + timedelta(minutes=1), actions=["promote@a1-x"])
    assert gr.status is not None
    history = gr.status.history
    assert [h.reason for h in history] == ["Started", "Promoted"]
    started = time.monotonic()
    queued = d.post(gr, history)
    assert time.monotonic() - started < 0.5  # queued, not sent: a round never waits
    assert queued == 2 * 5
    try:
        await eventually_async(
            lambda: len(rec.at("/ok/")) == 4, timeout=30, interval=0.05, what="json and slack delivered"
        )
        await eventually_async(
            lambda: len(rec.at("/flaky/")) == 2,
            timeout=30,
            interval=0.05,
            what="the flaky receiver's two after retries",
        )
        await eventually_async(
            lambda: _count(metrics, "gone", "refused") == 2,
            timeout=30,
            interval=0.05,
            what="the refusal counted",
        )
        # Order kept per webhook; the id is the same at every attempt.
        assert [r.body["reason"] for r in rec.at("/ok/json")] == ["Started", "Promoted"]
        assert [r.body["id"] for r in rec.at("/flaky/")] == [f"uid-1/{h.seq}" for h in history]
        assert _count(metrics, "hook", "sent") == 2
        assert _count(metrics, "flaky", "sent") == 2
        retries = metrics.registry.get_sample_value(
            "tinct_release_notification_retries_total", {"notifier": "flaky"}
        )
        assert retries == 2  # two 503s, then delivered
        assert rec.attempts["/gone/json"] == 2  # a 410 is not retried
        # The receiver that never answers: each attempt times out, then it is given up.
        await eventually_async(
            lambda: _count(metrics, "stuck", "failed") == 2,
            timeout=60,
            interval=0.05,
            what="the hanging webhook given up",
        )
        assert rec.attempts["/hang/json"] == 2 * 4
    finally:
        await d.close()


async def test_a_dead_webhook_costs_three_attempts_then_drops_until_it_answers_again() -> None:
    with receiver() as rec:
        notifiers = parse_notifiers(f"dead=json:{rec.url('/hang/dead')},live=json:{rec.url('/ok/live')}", {})
        metrics = ReleaseMetrics(CollectorRegistry())
        d = Dispatcher(
            notifiers, metrics, timeout=0.3, attempts=6, backoff=0.05, break_after=3, retry_after=1.0
        )
        gr = step(release(notify=[{"name": "dead"}, {"name": "live"}]), T0)
        assert gr.status is not None
        many = gr.status.history * 40
        try:
            assert d.post(gr, many) == 80
            await eventually_async(
                lambda: len(rec.at("/ok/live")) == 40,
                timeout=30,
                interval=0.05,
                what="the live webhook's forty",
            )
            await eventually_async(
                lambda: _count(metrics, "dead", "dropped") == 40,
                timeout=30,
                interval=0.05,
                what="the dead webhook's forty dropped",
            )

            def sample(name: str) -> float | None:
                return metrics.registry.get_sample_value(name, {"notifier": "dead"})

            # Three attempts in a row failed: the breaker opened; the rest were dropped unsent.
            assert rec.attempts["/hang/dead"] == 3
            assert _count(metrics, "dead", "failed") == 0
            assert (sample("tinct_release_notifier_open"), sample("tinct_release_notifier_opened_total")) == (
                1.0,
                1.0,
            )
            # Still dead after its wait: one attempt, and open again without another opening counted.
            await asyncio.sleep(1.1)
            d.post(gr, gr.status.history)
            await eventually_async(
                lambda: _count(metrics, "dead", "dropped") == 41,
                timeout=30,
                interval=0.05,
                what="the probe dropped",
            )
            assert rec.attempts["/hang/dead"] == 4
            assert sample("tinct_release_notifier_opened_total") == 1.0
            # It answers again: after the wait, the next notification is delivered and the breaker closes.
            rec.hang = False
            await asyncio.sleep(1.1)
            d.post(gr, gr.status.history)
            await eventually_async(
                lambda: _count(metrics, "dead", "sent") == 1,
                timeout=30,
                interval=0.05,
                what="delivered again",
            )
            assert sample("tinct_release_notifier_open") == 0.0
            assert [r.body["reason"] for r in rec.at("/hang/dead")] == ["Started"]
        finally:
            await d.close()

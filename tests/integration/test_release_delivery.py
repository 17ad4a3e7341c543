"""Webhook delivery against a real receiver: retries, refusals, a receiver that hangs or is gone
never holds up the controller, and a dead webhook costs three attempts, then drops until it
answers again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta

from prometheus_client import CollectorRegistry

from tinct.operator.grayrelease.metrics import ReleaseMetrics
from tinct.operator.grayrelease.notify import Dispatcher, parse_notifiers
from tinct_testing.notify_receiver import Receiver, receiver
from tinct_testing.release_helpers import T0, release, step
from tinct_testing.wait import eventually_async


async def _soon(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Wait (polling every 50 ms) for a delivery the webhooks' receiver or the metrics show."""
    await eventually_async(check, timeout=timeout, interval=0.05, what=what)


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
        await _soon(lambda: len(rec.at("/ok/")) == 4, "json and slack delivered")
        await _soon(lambda: len(rec.at("/flaky/")) == 2, "the flaky receiver's two after retries")
        await _soon(lambda: _count(metrics, "gone", "refused") == 2, "the refusal counted")
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
        await _soon(
            lambda: _count(metrics, "stuck", "failed") == 2, "the hanging webhook given up", timeout=60
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
            await _soon(lambda: len(rec.at("/ok/live")) == 40, "the live webhook's forty")
            await _soon(lambda: _count(metrics, "dead", "dropped") == 40, "the dead webhook's forty dropped")

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
            await _soon(lambda: _count(metrics, "dead", "dropped") == 41, "the probe dropped")
            assert rec.attempts["/hang/dead"] == 4
            assert sample("tinct_release_notifier_opened_total") == 1.0
            # It answers again: after the wait, the next notification is delivered and the breaker closes.
            rec.hang = False
            await asyncio.sleep(1.1)
            d.post(gr, gr.status.history)
            await _soon(lambda: _count(metrics, "dead", "sent") == 1, "delivered again")
            assert sample("tinct_release_notifier_open") == 0.0
            assert [r.body["reason"] for r in rec.at("/hang/dead")] == ["Started"]
        finally:
            await d.close()

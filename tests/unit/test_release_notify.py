"""Webhook notifications: configuration and the three formats. Delivery against a real HTTP
receiver is ``tests/integration/test_release_delivery.py``."""

from __future__ import annotations

import re

import pytest

from tinct.api.v1alpha1.grayrelease import GrayRelease
from tinct.operator.grayrelease.notify import parse_notifiers, payload, render
from tinct.operator.settings import OperatorConfig
from tinct_testing.release_helpers import T0, release, step


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

"""Names derived from a release's name: unique per side, within their kinds' limits."""

from __future__ import annotations

import re

from tinct.api.names import label_value, shortened
from tinct.api.routing import configmap_name
from tinct.operator.grayrelease.scaling import hpa_name, keda_hpa_name, scaled_object_name

LONGEST = "r" + "e" * 251 + "x"  # a GrayRelease name of 253 characters, the API's limit
LABEL = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_a_253_character_release_gets_one_hpa_per_side() -> None:
    stable, candidate = hpa_name(LONGEST, "stable"), hpa_name(LONGEST, "candidate")
    assert stable != candidate
    assert len(stable) <= 253
    assert len(candidate) <= 253
    assert stable.endswith("-stable")
    assert candidate.endswith("-candidate")
    # Another long name with the same beginning keeps its own HPAs.
    assert hpa_name(LONGEST[:-1] + "y", "stable") != stable
    assert hpa_name("chat", "stable") == "tinct-chat-stable", "short names are as before"


def test_keda_names_fit_a_label_value() -> None:
    for side in ("stable", "candidate"):
        so = scaled_object_name(LONGEST, side)
        assert len(so) <= 63
        assert LABEL.match(so)
        assert len(keda_hpa_name(so)) <= 253
    assert scaled_object_name(LONGEST, "stable") != scaled_object_name(LONGEST, "candidate")


def test_label_values_stay_apart_when_cut() -> None:
    a, b = label_value(LONGEST), label_value(LONGEST[:-1] + "y")
    assert a != b
    assert len(a) == 63
    assert LABEL.match(a)
    assert label_value("chat") == "chat"
    assert label_value("a" * 63) == "a" * 63


def test_shortened_keeps_prefix_and_suffix_and_cuts_at_no_separator() -> None:
    got = shortened("p-", "a" * 20 + "-" + "b" * 40, "-s", 30)
    assert len(got) == 30
    assert got.startswith("p-a")
    assert got.endswith("-s")
    assert "--" not in got


def test_routing_configmap_names_of_long_releases_fit_and_differ() -> None:
    ns = "n" * 63
    a, b = configmap_name(ns, LONGEST), configmap_name(ns, LONGEST[:-1] + "y")
    assert a != b
    assert len(a) <= 253

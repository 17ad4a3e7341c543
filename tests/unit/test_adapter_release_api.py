"""A LoRA adapter as a GrayRelease's candidate: stable's Service, pods and engine, its own name."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tinct.api.routing import RoutingTable
from tinct.api.v1alpha1 import GrayRelease
from tinct.api.v1alpha1.releasestatus import AdapterRelease
from tinct_testing.paths import EXAMPLES


def _adapter_release() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["spec"]["candidate"] = {"adapter": {"modelVersion": "llama3-8b-support-1-0-0"}}
    return doc


def test_adapter_candidate_is_served_by_stable() -> None:
    release = GrayRelease.model_validate(_adapter_release())
    stable, candidate = release.spec.stable, release.spec.candidate
    assert candidate.adapter is not None
    assert (candidate.service, candidate.port, candidate.engine) == (
        stable.service,
        stable.port,
        stable.engine,
    )
    assert candidate.model_version == "llama3-8b-support-1-0-0"
    assert candidate.deployment is None


def test_adapter_candidate_is_written_back_as_given() -> None:
    doc = _adapter_release()
    wire = GrayRelease.model_validate(doc).spec.wire()
    assert wire["candidate"] == {"adapter": {"modelVersion": "llama3-8b-support-1-0-0"}}
    again = GrayRelease.model_validate({**doc, "spec": wire})
    assert again.spec.candidate.service == doc["spec"]["stable"]["service"]


def test_plain_candidate_keeps_its_own_backend() -> None:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    wire = GrayRelease.model_validate(doc).spec.wire()
    assert wire["candidate"]["service"] == doc["spec"]["candidate"]["service"]
    assert "sharesStable" not in wire["candidate"]


def test_adapter_status_counts_pods() -> None:
    status = AdapterRelease.model_validate(
        {
            "modelVersion": "llama3-8b-support-1-0-0",
            "servedName": "llama3-8b-support-0123456789ab",
            "loaded": 5,
            "total": 6,
            "pods": [{"name": "sched-v1-0", "address": "10.0.0.7", "state": "Failed", "reason": "rank 64"}],
        }
    )
    assert (status.loaded, status.total, status.pods[0].state) == (5, 6, "Failed")


def test_table_of_adapter_candidate_names_served_name_and_pods() -> None:
    table = RoutingTable.model_validate(
        {
            "release": "chat",
            "version": 1,
            "stable": {"url": "http://sched-v1:8000", "schedulerVersion": "v1"},
            "candidate": {
                "url": "http://sched-v1:8000",
                "schedulerVersion": "v1",
                "adapter": "llama3-8b-support-0123456789ab",
                "addresses": ["http://127.0.0.7:8000"],
            },
            "dye": {"promptLength": {"buckets": [{"name": "all"}]}},
            "cells": [{"match": {}, "weight": 10}],
        }
    )
    assert table.candidate.adapter == "llama3-8b-support-0123456789ab"
    assert table.stable.adapter is None
    assert table.stable.addresses == []


def test_status_shows_on_how_many_pods_the_adapter_is() -> None:
    from tinct.release.matrix import matrix, render

    doc = _adapter_release()
    doc["metadata"]["namespace"] = "llm"
    doc["status"] = {
        "phase": "Progressing",
        "adapter": {
            "modelVersion": "llama3-8b-support-1-0-0",
            "servedName": "llama3-8b-support-0123456789ab",
            "loaded": 5,
            "total": 6,
            "pods": [
                {"name": "sched-v1-f", "address": "10.0.0.6", "state": "Failed", "reason": "out of memory"}
            ],
        },
    }
    text = render(matrix(GrayRelease.model_validate(doc)))
    assert (
        "adapter llama3-8b-support-0123456789ab loaded on 5/6 pods: sched-v1-f Failed (out of memory)" in text
    )

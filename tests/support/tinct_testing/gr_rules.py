"""One input per GrayRelease cross-field rule (and borderline inputs that pass), for the parity tests.

Each case mutates ``examples/grayrelease.yaml`` so that exactly one rule breaks (or none).
``tests/unit/test_api_rules.py`` runs them through the models and the routing table;
``tests/k8s/test_rules_parity.py`` runs the same inputs through the real API server too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from tinct.api.routing import RoutingTableError, parse_table
from tinct.api.v1alpha1 import GrayRelease
from tinct_testing.paths import EXAMPLES

Doc = dict[str, Any]


@dataclass(frozen=True)
class Case:
    """A GrayRelease input and the rule message it must be refused with (``None``: accepted).

    ``table`` is what the routing table built from the same dye, cells and backends must say:
    the same message for a rule it shares, its own for one it words differently, ``None`` when
    it accepts the input (a rule over fields the table does not have, or a valid input).
    """

    id: str
    mutate: Callable[[Doc], None]
    message: str | None
    table: str | None = None
    #: The rule's own message when ``message`` is built from the input (the cell, the value).
    rule: str | None = None
    #: The same for the routing table's rule; default: ``rule`` when ``table`` is ``message``.
    table_rule: str | None = None

    @property
    def rule_message(self) -> str | None:
        return self.rule or self.message

    @property
    def table_rule_message(self) -> str | None:
        if self.table is None:
            return None
        return self.table_rule or (self.rule if self.table == self.message else None) or self.table


def _buckets(*bounds: tuple[str, int | None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["spec"]["dye"]["promptLength"]["buckets"] = [
            {"name": n, **({"maxTokens": m} if m is not None else {})} for n, m in bounds
        ]

    return mutate


def _walk(node: Any, keys: list[str]) -> Any:
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def setting(path: str, value: Any) -> Callable[[Doc], None]:
    """A mutation setting the dotted ``path`` of a document (list items by index) to ``value``."""

    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node = _walk(doc, parents)
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _spec(path: str, value: Any) -> Callable[[Doc], None]:
    return setting(f"spec.{path}", value)


def _drop(path: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = f"spec.{path}".split(".")
        _walk(doc, parents).pop(last, None)

    return mutate


def _all(*mutations: Callable[[Doc], None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        for m in mutations:
            m(doc)

    return mutate


def _keda(
    *, stable: Doc, candidate: Doc, engines: tuple[str | None, str | None] = ("vllm", "sglang")
) -> Callable[[Doc], None]:
    """Scale through KEDA with these sides, the two backends naming ``engines``."""

    def mutate(doc: Doc) -> None:
        spec = doc["spec"]
        spec["autoscaling"]["keda"] = {"stable": stable, "candidate": candidate}
        for side, engine in zip(("stable", "candidate"), engines, strict=True):
            if engine is not None:
                spec[side]["engine"] = engine
            else:  # the example names its engines
                spec[side].pop("engine", None)

    return mutate


UNIQUE = "bucket names must be unique"
CATCH_ALL = "the last bucket is the catch-all: leave its maxTokens out"
ONLY_LAST = "only the last bucket may leave maxTokens out"
INCREASING = "bucket maxTokens must strictly increase from one bucket to the next"
DEFAULT_LISTED = "default must be one of values"
ONE_DEFAULT = "exactly one default cell (match: {}) is required"
KNOWN_BUCKET = "a cell's match.promptLength must be a bucket of dye.promptLength"
KNOWN_ROLE = "a cell's match.role must be one of dye.role.values"
KNOWN_LATENCY = "a cell's match.latency must be one of dye.latency.values"
OWN_MATCH = "each cell needs its own match"
UNEVEN = "every cell needs the same number of weights (one per step)"
SAME_BACKEND = "stable and candidate must be different backends"
SAME_MV = "stable and candidate must be different ModelVersions"
ADAPTER_EXCLUSIVE = (
    "give candidate.adapter (a LoRA adapter on stable's pods) or candidate's own service, port, "
    "modelVersion and schedulerVersion, not both: an adapter candidate shares stable's Service, "
    "pods and engine"
)
#: A LoRA adapter of stable's ModelVersion (examples/adapter.yaml) as the candidate.
ADAPTER = {"adapter": {"modelVersion": "llama3-8b-support-1-0-0"}}
NO_ANALYSIS = (
    "give spec.analysis: metrics that judge the candidate at each step, or analysis: {} to step "
    "forward every interval (1m) without judging it"
)


def _dyn(message: str, rule: str, *, table: bool = True) -> dict[str, Any]:
    """A case's keywords for a message built from the input, shared by the table or not."""
    return {"message": message, "rule": rule, "table": message if table else None}


ENGINE_NEEDED = (
    "engine metrics (queue-depth, kv-cache-usage, prefix-cache-hit-rate) need spec.candidate.engine "
    "(an adapter candidate's is stable.engine)"
)
QUEUE = [{"name": "queue-depth", "max": 4}]
#: Metrics that need no engine: for cases that take the candidate's engine away.
ROUTER_ONLY = [{"name": "success-rate", "min": 99}, {"name": "ttft-p95", "maxMs": 1500}]

CASES = [
    Case("example", lambda d: None, None),
    Case("duplicate-bucket", _buckets(("short", 512), ("long", 4096), ("long", None)), UNIQUE, UNIQUE),
    Case(
        "bounded-last-bucket", _buckets(("short", 512), ("long", 4096), ("huge", 9000)), CATCH_ALL, CATCH_ALL
    ),
    Case(
        "unbounded-middle-bucket",
        _buckets(("short", 512), ("mid", None), ("long", None)),
        ONLY_LAST,
        ONLY_LAST,
    ),
    Case("equal-bounds", _buckets(("short", 512), ("medium", 512), ("long", None)), INCREASING, INCREASING),
    Case(
        "falling-bounds", _buckets(("short", 4096), ("medium", 512), ("long", None)), INCREASING, INCREASING
    ),
    Case("bounds-one-apart", _buckets(("short", 1), ("medium", 2), ("long", None)), None),
    Case("role-default-unlisted", _spec("dye.role.default", "guest"), DEFAULT_LISTED, DEFAULT_LISTED),
    Case("latency-default-unlisted", _spec("dye.latency.default", "mid"), DEFAULT_LISTED, DEFAULT_LISTED),
    Case(
        "stream-class-unlisted",
        _spec("dye.latency.streamClass", "mid"),
        "streamClass must be one of values",
        "streamClass must be one of values",
    ),
    Case("stream-class-listed", _spec("dye.latency.streamClass", "high"), None),
    Case(
        "falling-weights",
        _spec("cells.1.weights", [10, 1, 50, 100]),
        "weights must never decrease from one step to the next",
    ),
    Case("flat-weights", _spec("cells.1.weights", [10, 10, 10, 100]), None),
    Case("two-default-cells", _spec("cells.0.match", {"promptLength": "*"}), ONE_DEFAULT, ONE_DEFAULT),
    Case("no-default-cell", _spec("cells.2.match", {"role": "audit"}), ONE_DEFAULT, ONE_DEFAULT),
    Case(
        "unknown-bucket",
        _spec("cells.0.match.promptLength", "huge"),
        **_dyn(
            'cells[0].match.promptLength "huge" is not a bucket of dye.promptLength ["short", "medium", "long"]',
            KNOWN_BUCKET,
        ),
    ),
    Case(
        "unknown-role",
        _spec("cells.1.match.role", "admn"),
        **_dyn(
            'cells[1].match.role "admn" is not one of dye.role.values ["user", "admin", "audit"]', KNOWN_ROLE
        ),
    ),
    Case(
        "unknown-latency",
        _spec("cells.0.match.latency", "mid"),
        **_dyn(
            'cells[0].match.latency "mid" is not one of dye.latency.values ["low", "high"]', KNOWN_LATENCY
        ),
    ),
    Case(
        "duplicate-match",
        _spec("cells.1.match", {"promptLength": "long", "role": "admin", "latency": "high"}),
        **_dyn(
            "cells[1] has the same match as an earlier cell (len:long+role:admin+latency:high): the "
            "router would follow one of them only; give each cell its own match",
            OWN_MATCH,
        ),
    ),
    Case(
        "duplicate-match-by-wildcard",
        _all(
            _spec("cells.0.match", {"promptLength": "long", "role": "*"}),
            _spec("cells.1.match", {"promptLength": "long"}),
        ),
        **_dyn(
            "cells[1] has the same match as an earlier cell (len:long+role:*+latency:*): the "
            "router would follow one of them only; give each cell its own match",
            OWN_MATCH,
        ),
    ),
    Case(
        "uneven-steps",
        _spec("cells.2.weights", [1, 100]),
        **_dyn(
            "cells[2] has 2 weights but cells[0] has 4: give every cell one weight per step",
            UNEVEN,
            table=False,
        ),
    ),
    Case(
        "same-backend",
        _spec("candidate.service", "sched-v1"),
        "stable and candidate are both Service sched-v1 port 8000: a release moves traffic between two "
        "different backends",
        "stable and candidate must be different endpoints",
        rule=SAME_BACKEND,
    ),
    Case(
        "same-modelversion",
        _spec("candidate.modelVersion", "llama3-8b-1-4-0"),
        **_dyn(
            "stable and candidate are both ModelVersion llama3-8b-1-4-0: a release moves traffic from one "
            "version of a model to another",
            SAME_MV,
            table=False,
        ),
    ),
    Case("adapter-candidate", _spec("candidate", ADAPTER), None),
    Case(
        "adapter-and-service",
        _spec("candidate", {**ADAPTER, "service": "sched-v2", "port": 8000}),
        ADAPTER_EXCLUSIVE,
    ),
    Case(
        "adapter-with-deployment",
        _spec("candidate", {**ADAPTER, "deployment": "sched-v2"}),
        ADAPTER_EXCLUSIVE,
    ),
    Case(
        "adapter-of-stable-itself",
        _spec("candidate", {"adapter": {"modelVersion": "llama3-8b-1-4-0"}}),
        **_dyn(
            "stable and candidate are both ModelVersion llama3-8b-1-4-0: a release moves traffic from one "
            "version of a model to another",
            SAME_MV,
            table=False,
        ),
    ),
    Case("no-analysis", _drop("analysis"), NO_ANALYSIS),
    Case("analysis-opt-out", _spec("analysis", {}), None),
    Case(
        "same-service-other-port",
        _all(_spec("candidate.service", "sched-v1"), _spec("candidate.port", 8001)),
        None,
    ),
    Case(
        "custom-without-query",
        _spec("analysis.metrics", [{"name": "custom", "max": 1}]),
        "a custom metric needs a query",
    ),
    Case(
        "query-on-builtin",
        _spec("analysis.metrics", [{"name": "success-rate", "min": 99, "query": "up"}]),
        "only custom metrics take a query",
    ),
    Case(
        "no-threshold",
        _spec("analysis.metrics", [{"name": "success-rate"}]),
        "give a threshold: min, max or maxMs",
    ),
    Case(
        "max-ms-on-a-rate",
        _spec("analysis.metrics", [{"name": "throttle-rate", "maxMs": 5}]),
        "maxMs is for latency-p95, ttft-p95 and itl-p95; give others min or max",
    ),
    Case(
        "quantile-on-a-rate",
        _spec("analysis.metrics", [{"name": "success-rate", "min": 99, "quantile": 0.9}]),
        "quantile is for latency-p95, ttft-p95 and itl-p95",
    ),
    Case("ttft-p99", _spec("analysis.metrics", [{"name": "ttft-p95", "maxMs": 900, "quantile": 0.99}]), None),
    Case(
        "engine-metric-without-engine",
        _all(_spec("analysis.metrics", QUEUE), _drop("candidate.engine")),
        ENGINE_NEEDED,
    ),
    Case(
        "engine-metric-default-selector",
        _all(_spec("analysis.metrics", QUEUE), _drop("candidate.metricsSelector")),
        None,
    ),
    Case(
        "engine-metric-stable-without-engine",
        # The example's KEDA scaling reads stable's engine too: scale by HPA here.
        _all(
            _spec("analysis.metrics", QUEUE),
            _drop("stable.engine"),
            _drop("stable.metricsSelector"),
            _drop("autoscaling.keda"),
        ),
        None,
    ),
    Case(
        "selector-key-not-a-label-name",
        _spec("candidate.metricsSelector", {"app.kubernetes.io/name": "sched-v2"}),
        "metricsSelector keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, at most 128 characters)",
    ),
    Case(
        "selector-key-too-long",
        _spec("candidate.metricsSelector", {"k" * 129: "sched-v2"}),
        "metricsSelector keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, at most 128 characters)",
    ),
    Case("selector-key-at-the-limit", _spec("candidate.metricsSelector", {"k" * 128: "sched-v2"}), None),
    Case(
        "min-above-max-replicas", _spec("autoscaling.minReplicas", 20), "minReplicas must be <= maxReplicas"
    ),
    Case("min-equals-max-replicas", _spec("autoscaling.minReplicas", 12), None),
    Case("interval-too-short", _spec("analysis.interval", "1500ms"), "interval must be at least 2s"),
    Case(
        "interval-in-words",
        _spec("analysis.interval", "1 minute"),
        "'1 minute' is not a duration: write a number and a unit (ms, s, m or h) such as 30s, 1m, 2h or 1m30s",
        rule="interval must be a duration: a number and a unit (ms, s, m or h) such as 30s, 1m, 2h or 1m30s",
    ),
    Case(
        "interval-without-unit",
        _spec("analysis.interval", "60"),
        "'60' is not a duration",
        rule="interval must be a duration: a number and a unit (ms, s, m or h) such as 30s, 1m, 2h or 1m30s",
    ),
    Case("interval-at-the-minimum", _spec("analysis.interval", "2s"), None),
    Case(
        "prometheus-name-and-url",
        _spec("analysis.prometheus", {"name": "fleet", "url": "http://p:9090"}),
        "give prometheus.name or prometheus.url, not both",
    ),
    Case("keda-on-engines", _keda(stable={}, candidate={}), None),
    Case(
        "keda-stable-without-engine",
        _keda(stable={}, candidate={}, engines=(None, "vllm")),
        "autoscaling.keda scales stable on its engine's queue: name stable.engine, or give "
        "autoscaling.keda.stable.query",
    ),
    Case(
        "keda-candidate-without-engine",
        _all(_keda(stable={}, candidate={}, engines=("vllm", None)), _spec("analysis.metrics", ROUTER_ONLY)),
        "autoscaling.keda scales candidate on its engine's queue: name candidate.engine, or give "
        "autoscaling.keda.candidate.query",
    ),
    Case(
        "keda-own-queries-without-engines",
        _all(
            _keda(stable={"query": "sum(q_v1)"}, candidate={"query": "sum(q_v2)"}, engines=(None, None)),
            _spec("analysis.metrics", ROUTER_ONLY),
        ),
        None,
    ),
    Case(
        "keda-side-without-deployment-needs-no-engine",
        _all(_keda(stable={}, candidate={}, engines=(None, "sglang")), _drop("stable.deployment")),
        None,
    ),
    Case(
        "keda-bad-label-name",
        _keda(stable={"labels": {"pod-name": "v1"}}, candidate={}),
        "labels must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, at most 128 characters)",
    ),
    Case(
        "keda-labels-and-query",
        _keda(stable={"labels": {"pod": "v1"}, "query": "sum(q)"}, candidate={}),
        "give labels or query, not both: labels select the series of the engine's default query",
    ),
    Case(
        "keda-same-labels",
        _keda(stable={"labels": {"job": "llm"}}, candidate={"labels": {"job": "llm"}}),
        "stable and candidate need different labels: each side scales on its own series",
    ),
    Case(
        "keda-same-query",
        _keda(stable={"query": "sum(q)"}, candidate={"query": "sum(q)"}),
        "stable and candidate need different queries: each side scales on its own signal",
    ),
]


SHADOW_LENGTH = "shadow needs one share per step, as many as weights"
SHADOW_NEEDS_CELL = (
    "shadow-agreement judges mirrored requests: give a cell a shadow share above 0 (cells[].shadow)"
)
SHADOW_MIN_ONLY = "shadow-agreement takes min (percent agreement after the noise floor) only"
AGREEMENT = [{"name": "shadow-agreement", "min": 95, "minPairs": 30}]

CASES += [
    Case("dark-step", _spec("cells.1.shadow", [10, 5, 20, 0]), None),
    Case("shadow-too-short", _spec("cells.1.shadow", [10, 5]), SHADOW_LENGTH),
    Case(
        "shadow-agreement-on-a-dark-step",
        _all(_spec("cells.1.shadow", [10, 5, 20, 0]), _spec("analysis.metrics", AGREEMENT)),
        None,
    ),
    Case("shadow-agreement-without-shadow", _spec("analysis.metrics", AGREEMENT), SHADOW_NEEDS_CELL),
    Case(
        "shadow-agreement-with-max",
        _all(
            _spec("cells.1.shadow", [10, 5, 20, 0]),
            _spec("analysis.metrics", [{"name": "shadow-agreement", "min": 90, "max": 99}]),
        ),
        SHADOW_MIN_ONLY,
    ),
    Case(
        "min-pairs-on-a-rate",
        _spec("analysis.metrics", [{"name": "success-rate", "min": 99, "minPairs": 5}]),
        "minPairs is for shadow-agreement",
    ),
    Case(
        "length-ratio-inverted",
        _spec("shadow", {"lengthRatio": {"min": 3, "max": 2}}),
        "lengthRatio.min must not be above lengthRatio.max",
        "lengthRatio.min must not be above lengthRatio.max",
    ),
]


def release_doc(case: Case) -> Doc:
    doc: Doc = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    doc = copy.deepcopy(doc)
    case.mutate(doc)
    return doc


def table_doc(release: Doc) -> Doc:
    """The routing-table document with the release's dye, cells (first step) and backends."""
    spec = release["spec"]

    def endpoint(side: str) -> Doc:
        backend = spec[side]
        if side == "candidate" and "adapter" in backend:  # served by stable's Service
            stable = spec["stable"]
            return {
                "url": f"http://{stable['service']}:{stable['port']}",
                "schedulerVersion": stable["schedulerVersion"],
                "adapter": f"{backend['adapter']['modelVersion']}-0123456789ab",
            }
        return {
            "url": f"http://{backend['service']}:{backend['port']}",
            "schedulerVersion": backend["schedulerVersion"],
        }

    return {
        "release": release["metadata"]["name"],
        "version": 1,
        "stable": endpoint("stable"),
        "candidate": endpoint("candidate"),
        "dye": spec["dye"],
        "cells": [{"match": c.get("match", {}), "weight": c["weights"][0]} for c in spec["cells"]],
        "fallback": spec.get("fallback", {}),
        **({"shadow": spec["shadow"]} if "shadow" in spec else {}),
    }


def model_refusal(release: Doc) -> str | None:
    """Why the GrayRelease model refuses ``release``, or ``None``."""
    try:
        GrayRelease.model_validate(release)
    except ValidationError as e:
        return str(e)
    return None


def table_refusal(release: Doc) -> str | None:
    """Why the routing table of ``release`` is refused, or ``None``."""
    try:
        parse_table(json.dumps(table_doc(release)))
    except RoutingTableError as e:
        return e.reason
    return None

"""The generated CRDs on a real API server: examples accepted, bad input rejected by name."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.gr_rules import setting
from tinct_testing.paths import EXAMPLES


def _example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def _apply(cluster: Cluster, ns: str, doc: dict[str, Any]) -> tuple[int, str]:
    proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_accepted_as_shipped(cluster: Cluster, namespace: str, path: Path) -> None:
    proc = cluster.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert proc.returncode == 0, proc.stderr
    for doc in yaml.safe_load_all(path.read_text()):
        kind = doc["kind"].lower()
        got = yaml.safe_load(
            cluster.kubectl("get", kind, doc["metadata"]["name"], "-n", namespace, "-o", "yaml").stdout
        )
        assert got["spec"]["cells" if kind == "grayrelease" else "artifacts"]


def test_server_applies_schema_defaults(cluster: Cluster, namespace: str) -> None:
    doc = _example("grayrelease.yaml")
    del doc["spec"]["fallback"]
    del doc["spec"]["dye"]["latency"]
    rc, out = _apply(cluster, namespace, doc)
    assert rc == 0, out
    got = yaml.safe_load(cluster.kubectl("get", "gr", "chat", "-n", namespace, "-o", "yaml").stdout)
    assert got["spec"]["fallback"] == {
        "consecutiveFailures": 3,
        "latencyMs": 800,
        "cooldownSeconds": 30,
        "idleTimeoutMs": 60000,
    }
    assert got["spec"]["dye"]["latency"] == {
        "header": "X-Latency-Class",
        "values": ["low", "high"],
        "default": "low",
    }


Mutation = Callable[[dict[str, Any]], None]


INVALID: list[tuple[str, str, Mutation, tuple[str, ...]]] = [
    # A person reads what to write, not a 200-character regular expression.
    (
        "bad-semver",
        "modelversion.yaml",
        setting("spec.version", "v1.2"),
        (
            "spec.version: Invalid value: 'v1.2' is not a semantic version: write MAJOR.MINOR.PATCH such as "
            "2.0.0, optionally with -rc.1 or +build.5 (no leading v)",
        ),
    ),
    (
        "two-part-semver",
        "modelversion.yaml",
        setting("spec.version", "2.0"),
        ("'2.0' is not a semantic version",),
    ),
    (
        "unknown-artifact-format",
        "modelversion.yaml",
        setting("spec.artifacts.0.format", "gguf"),
        ("spec.artifacts[0].format", "Unsupported value", '"onnx"'),
    ),
    ("empty-artifacts", "modelversion.yaml", setting("spec.artifacts", []), ("spec.artifacts", "at least 1")),
    (
        "bad-digest",
        "modelversion.yaml",
        setting("spec.artifacts.2.sha256", "xyz"),
        ("spec.artifacts[2].sha256",),
    ),
    (
        "uri-scheme",
        "modelversion.yaml",
        setting("spec.artifacts.0.uri", "http://example/model.onnx"),
        ("spec.artifacts[0].uri",),
    ),
    (
        "lora-without-adapter",
        "adapter.yaml",
        lambda doc: doc["spec"].pop("adapter"),
        ("spec.artifacts", "lora artifacts belong to an adapter"),
    ),
    (
        "adapter-of-onnx",
        "adapter.yaml",
        setting("spec.artifacts.0.format", "onnx"),
        ("spec.artifacts", "an adapter (spec.adapter) has only lora artifacts"),
    ),
    (
        "adapter-without-base",
        "adapter.yaml",
        setting("spec.adapter", {}),
        ("spec.adapter.baseModelVersion", "Required value"),
    ),
    (
        "bad-runtime",
        "modelversion.yaml",
        setting("spec.runtime", "pytorch"),
        ("spec.runtime", "Unsupported value"),
    ),
    (
        "weight-150",
        "grayrelease.yaml",
        setting("spec.cells.0.weights", [5, 150, 150, 150]),
        ("spec.cells[0].weights[1]", "less than or equal to 100"),
    ),
    (
        "decreasing-weights",
        "grayrelease.yaml",
        setting("spec.cells.1.weights", [10, 1, 50, 100]),
        ("spec.cells[1].weights", "never decrease"),
    ),
    (
        "two-default-cells",
        "grayrelease.yaml",
        setting("spec.cells.0.match", {"promptLength": "*"}),
        ("spec.cells", "exactly one default cell"),
    ),
    (
        "no-default-cell",
        "grayrelease.yaml",
        setting("spec.cells.2.match", {"role": "audit"}),
        ("spec.cells", "exactly one default cell"),
    ),
    (
        "uneven-steps",
        "grayrelease.yaml",
        setting("spec.cells.2.weights", [1, 100]),
        (
            "spec.cells: Invalid value: cells[2] has 2 weights but cells[0] has 4: give every cell one weight per step",
        ),
    ),
    (
        "unknown-role-in-match",
        "grayrelease.yaml",
        setting("spec.cells.0.match.role", "admn"),
        (
            'spec.cells: Invalid value: cells[0].match.role "admn" is not one of dye.role.values ["user", "admin", "audit"]',
        ),
    ),
    (
        "unknown-bucket-in-match",
        "grayrelease.yaml",
        setting("spec.cells.0.match.promptLength", "huge"),
        ("spec.cells", "bucket of dye.promptLength"),
    ),
    (
        "role-default-not-listed",
        "grayrelease.yaml",
        setting("spec.dye.role.default", "guest"),
        ("spec.dye.role", "default must be one of values"),
    ),
    (
        "buckets-not-increasing",
        "grayrelease.yaml",
        setting(
            "spec.dye.promptLength.buckets",
            [{"name": "a", "maxTokens": 900}, {"name": "b", "maxTokens": 10}, {"name": "c"}],
        ),
        ("spec.dye.promptLength.buckets", "strictly increase"),
    ),
    (
        "custom-metric-without-query",
        "grayrelease.yaml",
        setting("spec.analysis.metrics", [{"name": "custom", "max": 1}]),
        ("spec.analysis.metrics[0]", "needs a query"),
    ),
    (
        "min-above-max-replicas",
        "grayrelease.yaml",
        setting("spec.autoscaling.minReplicas", 20),
        ("spec.autoscaling", "minReplicas must be <= maxReplicas"),
    ),
    ("port-zero", "grayrelease.yaml", setting("spec.stable.port", 0), ("spec.stable.port",)),
    (
        "same-backend",
        "grayrelease.yaml",
        setting("spec.candidate.service", "sched-v1"),
        ("spec: Invalid value: stable and candidate are both Service sched-v1 port 8000",),
    ),
    (
        "same-modelversion",
        "grayrelease.yaml",
        setting("spec.candidate.modelVersion", "llama3-8b-1-4-0"),
        ("stable and candidate are both ModelVersion llama3-8b-1-4-0",),
    ),
    (
        "duplicate-match",
        "grayrelease.yaml",
        setting("spec.cells.1.match", {"promptLength": "long", "role": "admin", "latency": "high"}),
        (
            "spec.cells: Invalid value: cells[1] has the same match as an earlier cell (len:long+role:admin+latency:high)",
        ),
    ),
]


@pytest.mark.parametrize(("case", "example", "mutate", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_resources_are_rejected_naming_the_field(
    cluster: Cluster,
    namespace: str,
    case: str,
    example: str,
    mutate: Mutation,
    expected: tuple[str, ...],
) -> None:
    doc = copy.deepcopy(_example(example))
    mutate(doc)
    rc, out = _apply(cluster, namespace, doc)
    assert rc != 0, f"{case}: the API server accepted it:\n{out}"
    assert "is invalid" in out, out
    for needle in expected:
        assert needle in out, f"{case}: {needle!r} not in:\n{out}"
    kind = doc["kind"].lower()
    missing = cluster.kubectl("get", kind, doc["metadata"]["name"], "-n", namespace, check=False)
    assert missing.returncode != 0, "a rejected object must not be stored"


#: One mistake, one error: the whole of what ``kubectl apply`` says about it.
ONE_ERROR: list[tuple[str, Mutation, str]] = [
    (
        # Over the maximum and above the next step: the order rule leaves it to the maximum.
        "weight-150",
        setting("spec.cells.0.weights", [5, 150, 50, 100]),
        'The GrayRelease "chat" is invalid: spec.cells[0].weights[1]: Invalid value: 150: '
        "spec.cells[0].weights[1] in body should be less than or equal to 100",
    ),
    (
        "interval-in-words",
        setting("spec.analysis.interval", "1 minute"),
        "The GrayRelease \"chat\" is invalid: spec.analysis.interval: Invalid value: '1 minute' is not a "
        "duration: write a number and a unit (ms, s, m or h) such as 30s, 1m, 2h or 1m30s",
    ),
    (
        "interval-too-short",
        setting("spec.analysis.interval", "1s"),
        'The GrayRelease "chat" is invalid: spec.analysis.interval: Invalid value: '
        "interval must be at least 2s",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "expected"), ONE_ERROR, ids=[c[0] for c in ONE_ERROR])
def test_one_mistake_is_one_readable_error(
    cluster: Cluster, namespace: str, case: str, mutate: Mutation, expected: str
) -> None:
    doc = copy.deepcopy(_example("grayrelease.yaml"))
    mutate(doc)
    proc = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0, f"{case}: the API server accepted it"
    assert proc.stderr.strip() == expected


def test_kubectl_get_shows_printer_columns(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES))
    out = cluster.kubectl("get", "mv,gr", "-n", namespace).stdout
    lines = out.splitlines()
    mv_header = next(line for line in lines if line.startswith("NAME") and "MODEL" in line)
    assert mv_header.split() == ["NAME", "MODEL", "VERSION", "PHASE", "AGE"]
    gr_header = next(line for line in lines if line.startswith("NAME") and "CANDIDATE" in line)
    assert " ".join(gr_header.split()) == "NAME STABLE CANDIDATE STEP WEIGHT ANALYSIS TABLE PHASE AGE"
    mv_row = next(line for line in lines if line.startswith("modelversion.tinct.io/llama3-8b-2-0-0"))
    assert mv_row.split()[1:3] == ["llama3-8b", "2.0.0"]
    gr_row = next(line for line in lines if line.startswith("grayrelease.tinct.io/chat"))
    assert gr_row.split()[1:3] == ["llama3-8b-1-4-0", "llama3-8b-2-0-0"]
    # Short names and the category resolve too.
    assert "llama3-8b-2-0-0" in cluster.kubectl("get", "tinct", "-n", namespace).stdout
    wide = cluster.kubectl("get", "mv", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[-2:] == ["RUNTIME", "MESSAGE"]


def test_status_is_a_subresource(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "modelversion.yaml"))
    # A plain update cannot set status; the status subresource can.
    doc = _example("modelversion.yaml")
    doc["status"] = {"phase": "Ready"}
    _apply(cluster, namespace, doc)
    get = ["get", "mv", "llama3-8b-2-0-0", "-n", namespace, "-o", "jsonpath={.status.phase}"]
    patch = ["patch", "mv", "llama3-8b-2-0-0", "-n", namespace, "--subresource=status", "--type=merge", "-p"]
    assert cluster.kubectl(*get).stdout == ""
    cluster.kubectl(*patch, '{"status": {"phase": "Ready"}}')
    assert cluster.kubectl(*get).stdout == "Ready"
    bad = cluster.kubectl(*patch, '{"status": {"phase": "Done"}}', check=False)
    assert bad.returncode != 0
    assert "status.phase" in bad.stderr

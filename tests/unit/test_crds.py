"""CRDs are generated from the models: committed copies match and stay structural."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tinct.api.crd import crd, render, structural_schema
from tinct.api.v1alpha1 import RESOURCES, GrayRelease, ModelVersion
from tinct_testing.paths import CRDS, EXAMPLES, ROOT


def test_committed_crds_match_the_models(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    subprocess.run([sys.executable, "-m", "tinct.cli", "crds", "--out", str(out)], check=True)
    generated = sorted(p.name for p in out.iterdir())
    assert generated == sorted(p.name for p in CRDS.glob("*.yaml")), "crds/ holds other files than generated"
    for name in generated:
        assert (out / name).read_text() == (CRDS / name).read_text(), (
            f"crds/{name} is stale: run `tinct crds --out crds` and commit the result"
        )


def crd_copy_problems(root: Path) -> list[str]:
    """What is wrong with the tinct CRDs shipped under ``root`` outside ``crds/``.

    Every YAML document of kind CustomResourceDefinition for a tinct resource, wherever it
    is (a Helm chart's ``crds/``, docs, examples), must equal the generated one; every chart
    (a directory with ``Chart.yaml``) under ``charts/`` must ship each CRD in its ``crds/``.
    """
    generated = {r.crd_name: crd(r) for r in RESOURCES}
    problems: list[str] = []
    for chart in sorted((root / "charts").glob("*/Chart.yaml")):
        for r in RESOURCES:
            if not (chart.parent / "crds" / r.file_name).is_file():
                problems.append(f"{chart.parent.relative_to(root)}/crds/{r.file_name} is missing")
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [
            d for d in subdirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")
        ]
        here = Path(directory)
        if here == root / "crds":
            continue
        for name in files:
            if not name.endswith((".yaml", ".yml")):
                continue
            path = here / name
            try:
                docs = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError:
                continue  # a Helm template, not plain YAML: CRDs in charts live in crds/
            for doc in docs:
                if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                    continue
                name_ = (doc.get("metadata") or {}).get("name")
                if name_ in generated and doc != generated[name_]:
                    problems.append(f"{path.relative_to(root)}: {name_} differs from `tinct crds`")
    return problems


def test_every_crd_copy_matches_the_models() -> None:
    assert crd_copy_problems(ROOT) == []


def test_a_stale_or_missing_chart_crd_is_reported(tmp_path: Path) -> None:
    chart = tmp_path / "charts" / "tinct"
    (chart / "crds").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tinct\nversion: 0.1.0\n")
    mv, gr = RESOURCES
    (chart / "crds" / mv.file_name).write_text(render(mv))
    assert crd_copy_problems(tmp_path) == [f"charts/tinct/crds/{gr.file_name} is missing"]
    stale = crd(gr)
    stale["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ].pop()
    (chart / "crds" / gr.file_name).write_text(yaml.safe_dump(stale))
    assert crd_copy_problems(tmp_path) == [
        f"charts/tinct/crds/{gr.file_name}: grayreleases.tinct.io differs from `tinct crds`"
    ]
    (chart / "crds" / gr.file_name).write_text(render(gr))
    assert crd_copy_problems(tmp_path) == []


def _walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, node)]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _walk(v, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_schema_is_structural(resource: Any) -> None:
    for model in (resource.spec, resource.status):
        for path, node in _walk(structural_schema(model)):
            if not isinstance(node, dict) or path.endswith((".properties", ".default")) or ".default" in path:
                continue
            for forbidden in ("$ref", "$defs", "title", "anyOf", "oneOf", "allOf", "const"):
                assert forbidden not in node, f"{resource.kind}{path} has {forbidden}"
            if "properties" in node or "items" in node or "additionalProperties" in node:
                assert "type" in node, f"{resource.kind}{path} lacks a type"
            if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(
                node.get("exclusiveMinimum"), bool
            ):
                raise AssertionError(
                    f"{resource.kind}{path}: exclusiveMinimum must be boolean in OpenAPI v3.0"
                )


def test_optional_fields_are_nullable_and_required_fields_listed() -> None:
    spec = structural_schema(RESOURCES[0].spec)
    assert set(spec["required"]) == {"model", "version", "artifacts"}
    assert spec["properties"]["buildPipelineId"]["nullable"] is True
    assert spec["properties"]["artifacts"]["minItems"] == 1
    fmt = spec["properties"]["artifacts"]["items"]["properties"]["format"]
    assert fmt["enum"] == ["onnx", "ptx", "safetensors", "tokenizer", "lora"]


def test_crd_metadata() -> None:
    docs = {
        d["spec"]["names"]["kind"]: d for d in (yaml.safe_load(p.read_text()) for p in CRDS.glob("*.yaml"))
    }
    mv, gr = docs["ModelVersion"], docs["GrayRelease"]
    assert mv["spec"]["names"]["shortNames"] == ["mv"]
    assert gr["spec"]["names"]["shortNames"] == ["gr"]
    for doc in (mv, gr):
        (version,) = doc["spec"]["versions"]
        assert version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}
    cols = [c["name"] for c in mv["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Model", "Version", "Phase", "Age"]
    cols = [c["name"] for c in gr["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Stable", "Candidate", "Step", "Weight", "Analysis", "Table", "Phase", "Age"]


def test_examples_parse_into_the_models() -> None:
    mv = ModelVersion.model_validate(yaml.safe_load((EXAMPLES / "modelversion.yaml").read_text()))
    assert mv.spec.version == "2.0.0"
    assert [a.format for a in mv.spec.artifacts] == [
        "onnx",
        "ptx",
        "safetensors",
        "safetensors",
        "safetensors",
        "tokenizer",
        "tokenizer",
    ]
    gr = GrayRelease.model_validate(yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text()))
    assert gr.spec.cells[0].weights == [5, 20, 50, 100]
    assert gr.spec.fallback.latency_ms == 800
    assert gr.spec.dye.prompt_length.buckets[-1].max_tokens is None


def test_models_reject_what_the_schema_rejects() -> None:
    doc = yaml.safe_load((EXAMPLES / "modelversion.yaml").read_text())
    doc["spec"]["version"] = "2.0"
    with pytest.raises(ValueError, match="version"):
        ModelVersion.model_validate(doc)


#: Developer markup that must not reach `kubectl explain`: reStructuredText roles and literals.
_MARKUP = re.compile(r"``|:(class|func|mod|data|meth|attr|ref):`")
#: Field names that carry a unit, and the word their description must name it with.
_UNITS = {"Seconds": "second", "Ms": "millisecond", "interval": "duration"}


def _fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property under ``node``, array items and map values walked into, with its path."""
    for name, sub in (node.get("properties") or {}).items():
        here = f"{path}.{name}"
        if here == f"{path.split('.')[0]}.metadata":
            continue  # ObjectMeta: the API server refuses a schema there, kubectl explains it itself
        yield here, sub
        yield from _fields(sub, here)
        for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
            inner = sub.get(key)
            if isinstance(inner, dict):
                yield from _fields(inner, here + mark)


def explain_problems(schema: dict[str, Any], kind: str) -> list[str]:
    """What `kubectl explain` would show badly: a field without a description, markup, a
    default or a unit the description does not give."""
    problems = []
    for path, node in _fields(schema, kind):
        text = node.get("description") or ""
        if not text.strip():
            problems.append(f"{path}: no description")
            continue
        if _MARKUP.search(text):
            problems.append(f"{path}: markup in {text!r}")
        default = node.get("default")
        spec = path.startswith(f"{kind}.spec.")  # status is the operator's: its defaults are no one's choice
        if spec and default is not None and not isinstance(default, (dict, list)) and "default" not in text:
            problems.append(f"{path}: its default {default!r} is not in {text!r}")
        leaf = path.rsplit(".", 1)[-1]
        for suffix, word in _UNITS.items():
            if leaf.endswith(suffix) and word not in text.lower() and "ms" not in text:
                problems.append(f"{path}: no unit ({word}) in {text!r}")
    return problems


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_kubectl_explain_has_a_description_for_every_field(resource: Any) -> None:
    schema = crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert explain_problems(schema, resource.kind) == []


def test_explain_problems_are_found() -> None:
    schema = {
        "properties": {
            "spec": {
                "description": "The spec.",
                "properties": {
                    "bare": {"type": "string"},
                    "marked": {"type": "string", "description": "See ``tinct``."},
                    "retries": {"type": "integer", "default": 3, "description": "Retries."},
                    "cooldownSeconds": {"type": "integer", "description": "How long to wait (default 3)."},
                    "list": {
                        "type": "array",
                        "description": "Items.",
                        "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                    },
                },
            }
        }
    }
    assert explain_problems(schema, "K") == [
        "K.spec.bare: no description",
        "K.spec.marked: markup in 'See ``tinct``.'",
        "K.spec.retries: its default 3 is not in 'Retries.'",
        "K.spec.cooldownSeconds: no unit (second) in 'How long to wait (default 3).'",
        "K.spec.list[].name: no description",
    ]

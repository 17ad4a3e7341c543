"""CRDs are generated from the models: committed copies match and stay structural."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import CRDS, EXAMPLES, ROOT
from tinct.api.crd import render, structural_schema
from tinct.api.v1alpha1 import RESOURCES, GrayRelease, ModelVersion


def test_committed_crds_match_the_models(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    subprocess.run([sys.executable, "-m", "tinct.cli", "crds", "--out", str(out)], check=True)
    generated = sorted(p.name for p in out.iterdir())
    assert generated == sorted(p.name for p in CRDS.glob("*.yaml")), "crds/ holds other files than generated"
    for name in generated:
        assert (out / name).read_text() == (CRDS / name).read_text(), (
            f"crds/{name} is stale: run `tinct crds --out crds` and commit the result"
        )


def test_chart_copies_match_when_the_chart_ships_crds() -> None:
    chart_crds = ROOT / "charts" / "tinct" / "crds"
    if not chart_crds.exists():
        assert not (ROOT / "charts").exists() or not any((ROOT / "charts").rglob("*crd*")), (
            "the chart ships CRDs outside charts/tinct/crds"
        )
        return
    for resource in RESOURCES:
        assert (chart_crds / resource.file_name).read_text() == render(resource)


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
    assert fmt["enum"] == ["onnx", "ptx", "safetensors"]


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
    assert cols == ["Stable", "Candidate", "Step", "Phase", "Age"]


def test_examples_parse_into_the_models() -> None:
    mv = ModelVersion.model_validate(yaml.safe_load((EXAMPLES / "modelversion.yaml").read_text()))
    assert mv.spec.version == "2.0.0"
    assert [a.format for a in mv.spec.artifacts] == ["onnx", "ptx", "safetensors", "safetensors"]
    gr = GrayRelease.model_validate(yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text()))
    assert gr.spec.cells[0].weights == [5, 20, 50, 100]
    assert gr.spec.fallback.latency_ms == 800
    assert gr.spec.dye.prompt_length.buckets[-1].max_tokens is None


def test_models_reject_what_the_schema_rejects() -> None:
    doc = yaml.safe_load((EXAMPLES / "modelversion.yaml").read_text())
    doc["spec"]["version"] = "2.0"
    with pytest.raises(ValueError, match="version"):
        ModelVersion.model_validate(doc)

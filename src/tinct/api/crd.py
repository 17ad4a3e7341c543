"""Generate CustomResourceDefinitions from the pydantic models.

The models in :mod:`tinct.api.v1alpha1` are the single source of truth; this module
turns their JSON schema into a *structural* OpenAPI v3 schema the API server accepts:
``$ref`` inlined, no ``title``, ``Optional[X]`` as ``X`` with ``nullable: true``,
JSON-Schema-2020 ``exclusiveMinimum`` rewritten in the OpenAPI v3.0 form, and the
CEL rules the models carry kept as ``x-kubernetes-validations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

_DROP = {"title"}


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.priority:
            out["priority"] = self.priority
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class CustomResource:
    """What the API server needs to serve one kind, besides its schema."""

    group: str
    version: str
    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[PrinterColumn, ...] = field(default=())

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def file_name(self) -> str:
        return f"{self.group}_{self.plural}.yaml"


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (camelCase field names)."""
    raw = _one_line_fields(model.model_json_schema(by_alias=True, mode="validation"))
    defs: dict[str, Any] = raw.pop("$defs", {})
    schema: dict[str, Any] = _convert(raw, defs)
    return schema


def _one_line_fields(node: Any) -> Any:
    """``node`` with each property's own description (a field docstring) on one line; a
    class's description, which a property without its own takes, keeps its lines."""
    if isinstance(node, list):
        return [_one_line_fields(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _one_line_fields(v) for k, v in node.items()}
    for sub in (out.get("properties") or {}).values():
        if isinstance(sub, dict) and isinstance(sub.get("description"), str):
            sub["description"] = " ".join(sub["description"].split())
    return out


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = _convert(defs[ref.rsplit("/", 1)[-1]], defs)
        node = {**target, **{k: v for k, v in node.items() if k not in _DROP}}
    any_of = node.get("anyOf")
    if any_of is not None:
        rest = [s for s in any_of if s != {"type": "null"}]
        if len(rest) != 1:
            raise ValueError(f"cannot express anyOf {any_of} in a structural schema")
        del node["anyOf"]
        inner = _convert(rest[0], defs)
        node = {**inner, **node}
        if len(rest) != len(any_of):
            node["nullable"] = True
            if node.get("default", 0) is None:
                del node["default"]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _convert(value, defs)
    if "enum" in out and "type" not in out:
        sample = out["enum"][0]
        out["type"] = "integer" if isinstance(sample, int) else "string"
    return out


def crd(resource: CustomResource) -> dict[str, Any]:
    """The CustomResourceDefinition manifest of ``resource``."""
    spec = structural_schema(resource.spec)
    status = structural_schema(resource.status)
    schema = {
        "type": "object",
        "description": (resource.spec.__doc__ or "").strip() or None,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"The versioned schema of this object: {resource.group}/{resource.version}.",
            },
            "kind": {"type": "string", "description": f"The kind of this object: {resource.kind}."},
            # The API server allows nothing else here; kubectl explain shows ObjectMeta's own docs.
            "metadata": {"type": "object"},
            "spec": {**spec, "description": f"The {resource.kind} as its author wants it."}
            if "description" not in spec
            else spec,
            "status": {
                **status,
                "description": f"The {resource.kind} as the operator last saw and recorded it; "
                "written by the operator only.",
            }
            if "description" not in status
            else status,
        },
    }
    if schema["description"] is None:
        del schema["description"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": resource.crd_name,
            "labels": {"app.kubernetes.io/part-of": "tinct"},
        },
        "spec": {
            "group": resource.group,
            "scope": "Namespaced",
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.singular,
                "shortNames": list(resource.short_names),
                "categories": ["tinct"],
            },
            "versions": [
                {
                    "name": resource.version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.wire() for c in resource.columns],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


HEADER = "# Generated by `tinct crds` from src/tinct/api/v1alpha1; do not edit by hand.\n"


def render(resource: CustomResource) -> str:
    return HEADER + yaml.safe_dump(crd(resource), sort_keys=False, width=100)


def write_all(out_dir: Path, resources: tuple[CustomResource, ...]) -> list[Path]:
    """Write one YAML file per resource into ``out_dir``; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for resource in resources:
        path = out_dir / resource.file_name
        path.write_text(render(resource))
        written.append(path)
    return written

"""charts/tinct through the real helm: rendering with values, picking documents out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from tinct_testing.controlplane.helm import Helm
from tinct_testing.paths import CHART


def sets(values: dict[str, Any] | None) -> list[str]:
    """``--set-json`` arguments for a flat mapping of dotted keys to values."""
    out: list[str] = []
    for key, value in (values or {}).items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def template(
    helm: Helm, values: dict[str, Any] | None = None, *extra: str, namespace: str = "tinct"
) -> list[dict[str, Any]]:
    """The documents ``helm template`` renders, parsed."""
    out = helm("template", "t", str(CHART), "--namespace", namespace, *sets(values), *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def container(deployment: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The Deployment's container ``name``; without a name, its first (its main one)."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = (
        containers[0] if name is None else next(c for c in containers if c["name"] == name)
    )
    return result

"""kwok on the test control plane: a fake Node whose Pods become Running and Ready.

There is no kubelet here. kwok (``sigs.k8s.io/kwok``, built by ``build.ensure_kwok``)
watches the API server and plays a kubelet's part for the Nodes it manages: it marks them
Ready, turns their Pending Pods Running with every container ready, and removes Pods
being deleted. The real ReplicaSet, Deployment and HPA controllers then compute real
availability from those Pods.

The harness creates one Node, :data:`NODE`, labelled :data:`NODE_LABEL`, and runs kwok
managing only Nodes with that label (so a real node joining later is left alone) with
the Stages in ``kwok-stages.yaml``. Nothing schedules Pods: a Pod lands on the Node by
naming it in ``spec.nodeName`` (:func:`placement`); a Pod that names no node stays
Pending as before. The Node is tainted ``NoSchedule`` so a scheduler, should one run
later, does not place other Pods on a node that runs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tinct_testing.controlplane import build

NODE = "kwok-node-0"
NODE_LABEL = ("kwok.x-k8s.io/node", "fake")
TAINT = {"key": NODE_LABEL[0], "value": NODE_LABEL[1], "effect": "NoSchedule"}
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
# Pod IPs kwok hands out; its default (10.0.0.0/24) is the API server's Service range.
POD_CIDR = "10.244.0.0/16"


def default_binary() -> Path | None:
    """The kwok binary the harness runs: built from its module, or none with ``KUBEBUILDER_ASSETS``.

    ``KUBEBUILDER_ASSETS`` means "use these binaries, build nothing": kwok runs only when
    that directory holds a ``kwok`` too.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        found = Path(assets) / "kwok"
        return found if found.is_file() else None
    return build.ensure_kwok()


def argv(binary: Path, kubeconfig: Path, stages: Path = STAGES) -> list[str]:
    key, value = NODE_LABEL
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # v0.8.0 run on its own has no default stages (kwokctl passes them in).
        f"--config={stages}",
        f"--manage-nodes-with-label-selector={key}={value}",
        f"--cidr={POD_CIDR}",
        # No --server-address or --node-port: no kubelet API (logs, exec) is served.
    ]


def environment(workdir: Path) -> dict[str, str]:
    """kwok also reads ``$KWOK_WORKDIR/kwok.yaml`` (default ``~/.kwok``): point it at ours."""
    return {"KWOK_WORKDIR": str(workdir)}


def node_manifest(name: str = NODE) -> dict[str, Any]:
    """The Node the harness creates; kwok fills its status (Ready, allocatable) from its stage."""
    key, value = NODE_LABEL
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                key: value,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"taints": [dict(TAINT)]},
    }


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def placement(node: str) -> dict[str, Any]:
    """The Pod spec fields that put a Pod on ``node`` and tolerate the fake node's taint."""
    return {"nodeName": node, "tolerations": [{**TAINT, "operator": "Equal"}]}


__all__ = [
    "NODE",
    "NODE_LABEL",
    "POD_CIDR",
    "STAGES",
    "TAINT",
    "argv",
    "default_binary",
    "environment",
    "node_manifest",
    "node_ready",
    "placement",
]

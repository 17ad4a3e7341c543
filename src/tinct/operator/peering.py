"""The kopf peering object the operator's replicas elect a leader through.

kopf keeps its peers in a ``ClusterKopfPeering`` (operator serving the whole cluster) or a
``KopfPeering`` per served namespace, but does not create that object: with mandatory
peering and no object the operator would stay paused. ``tinct operator --peering NAME``
creates the missing ones before kopf starts, so a fresh install needs no manual step.
Blocking (the sync ``kubernetes`` client); called once, before the event loop exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["GROUP", "PeeringError", "ensure_peering"]

GROUP = "kopf.dev"
VERSION = "v1"


class PeeringError(RuntimeError):
    """The peering object is missing and could not be created; says what to do."""


def _api() -> Any:
    from kubernetes import client

    from tinct.kubeconfig import api_client

    return client.CustomObjectsApi(api_client())


def _literal(namespace: str) -> bool:
    return not any(ch in namespace for ch in "*?[!")


def ensure_peering(name: str, namespaces: Sequence[str] = (), api: Any = None) -> list[str]:
    """Create the peering object(s) named ``name`` where missing; where each one lives.

    ``namespaces`` empty means the operator serves the whole cluster (ClusterKopfPeering).
    Namespace globs cannot be resolved here; their peering objects must exist already.

    Raises:
        PeeringError: the peering CRDs are not installed, or the API refused the creation.
    """
    from kubernetes.client.exceptions import ApiException

    api = api or _api()
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "metadata": {"name": name}}
    where: list[str] = []
    targets: list[str | None] = [ns for ns in namespaces if _literal(ns)] if namespaces else [None]
    for ns in targets:
        kind = "KopfPeering" if ns else "ClusterKopfPeering"
        try:
            if ns:
                api.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "kopfpeerings", {**body, "kind": kind}
                )
            else:
                api.create_cluster_custom_object(
                    GROUP, VERSION, "clusterkopfpeerings", {**body, "kind": kind}
                )
        except ApiException as exc:
            if exc.status == 409:  # already there: the usual case after the first start
                pass
            elif exc.status == 404:
                raise PeeringError(
                    f"the {kind} CRD is not installed: install the tinct chart (its crds/ holds "
                    f"kopf's peering CRDs) or run without --peering"
                ) from exc
            else:
                raise PeeringError(
                    f"could not create {kind} {name!r}{f' in {ns}' if ns else ''}: "
                    f"{exc.status} {exc.reason}; grant create on {GROUP} peerings or create it yourself"
                ) from exc
        where.append(f"{ns}/{name}" if ns else name)
    return where

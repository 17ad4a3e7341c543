"""The Kubernetes API calls of the GrayRelease controller, on the synchronous client.

Every method blocks; the controller runs them in a thread pool of their own (never shared
with Prometheus calls). Children are server-side applied under the field manager
:data:`FIELD_MANAGER`, so a retried reconcile converges instead of duplicating. Status is
written whole with the resourceVersion it was decided from as a precondition
(:meth:`ReleaseKube.replace_status`): a decision made on a status that has changed since is
refused by the API server (409) instead of overwriting the newer one.

:class:`TableWatch` follows the routing-table ConfigMaps of the table namespace alone,
selected by label on the server, so ConfigMaps elsewhere in the cluster never reach the
operator's memory (list+watch by :class:`~tinct.kubewatch.ListWatch`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinct.api.routing import (
    DATA_KEY,
    TABLE_LABEL,
    VERSION_ANNOTATION,
    RoutingTable,
    RoutingTableError,
    parse_table,
)
from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.kubewatch import Following, ListWatch
from tinct.operator.grayrelease.seal import RECORD_ANNOTATION, Record, parse_record

__all__ = ["FIELD_MANAGER", "ConflictError", "FoundTable", "ReleaseKube", "TableWatch"]

FIELD_MANAGER = "tinct-operator"
_APPLY = "application/apply-patch+yaml"
_log = logging.getLogger(__name__)


class ConflictError(Exception):
    """The object changed since the status being written was decided from it (HTTP 409)."""


class ReleaseKube:
    """Lazily connected; one instance serves every release of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                from tinct.kubeconfig import api_client

                self._client = api_client()
            return self._client

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api())

    def _apply(self, patch: Callable[..., Any], manifest: dict[str, Any]) -> None:
        """Server-side apply of ``manifest`` through the API's ``patch_namespaced_*`` call."""
        meta = manifest["metadata"]
        patch(
            meta["name"],
            meta["namespace"],
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )

    def apply_configmap(self, manifest: dict[str, Any]) -> None:
        self._apply(self._core().patch_namespaced_config_map, manifest)

    def delete_configmap(self, namespace: str, name: str) -> None:
        """Delete a ConfigMap; one already gone is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._core().delete_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def service_pods(
        self, namespace: str, service: str, port: int
    ) -> tuple[int, list[tuple[str, str | None, bool]]]:
        """The pods' port behind the Service ``service``'s ``port`` (its numeric targetPort, else
        ``port``) and (name, status.podIP, Ready) of the pods it selects; none for a Service
        without a selector, or one that does not exist."""
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        try:
            spec = core.read_namespaced_service(service, namespace).spec
        except ApiException as e:
            if e.status == 404:
                return port, []
            raise
        target = next((p.target_port for p in spec.ports or [] if p.port == port), None)
        if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
            port = int(target)
        selector = spec.selector or {}
        if not selector:
            return port, []
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        out: list[tuple[str, str | None, bool]] = []
        for pod in core.list_namespaced_pod(namespace, label_selector=labels).items:
            status = pod.status
            ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []) if status)
            deleting = pod.metadata.deletion_timestamp is not None
            out.append((pod.metadata.name, status.pod_ip if status else None, ready and not deleting))
        return port, out

    def apply_hpa(self, manifest: dict[str, Any]) -> None:
        from kubernetes import client

        self._apply(client.AutoscalingV2Api(self._api()).patch_namespaced_horizontal_pod_autoscaler, manifest)

    def delete_hpa(self, namespace: str, name: str) -> None:
        """Delete an HPA; one already gone is fine."""
        from kubernetes import client

        self._delete(
            client.AutoscalingV2Api(self._api()).delete_namespaced_horizontal_pod_autoscaler, namespace, name
        )

    def apply_scaled_object(self, manifest: dict[str, Any]) -> None:
        """Server-side apply of a KEDA ScaledObject."""
        from kubernetes import client

        meta = manifest["metadata"]
        client.CustomObjectsApi(self._api()).patch_namespaced_custom_object(
            "keda.sh",
            "v1alpha1",
            meta["namespace"],
            "scaledobjects",
            meta["name"],
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )

    def delete_scaled_object(self, namespace: str, name: str) -> None:
        """Delete a KEDA ScaledObject; one already gone (or KEDA not installed) is fine."""
        from kubernetes import client

        api = client.CustomObjectsApi(self._api())
        self._delete(
            lambda n, ns: api.delete_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", n),
            namespace,
            name,
        )

    def served(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` of ``group_version`` (e.g. ``keda.sh/v1alpha1``),
        from discovery, which every authenticated user may read."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        group, _, version = group_version.partition("/")
        try:
            found = client.CustomObjectsApi(self._api()).get_api_resources(
                group, version, _request_timeout=10
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.name == plural for r in (found.resources or []))

    @staticmethod
    def _delete(call: Callable[[str, str], Any], namespace: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def replace_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None
    ) -> str | None:
        """Replace the status of a GrayRelease with ``status``, whole (so that the status stored is
        exactly the one sealed), only if the object is still at ``resource_version``; returns
        its new resourceVersion.

        Raises:
            ConflictError: the object changed since ``resource_version``.
        """
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GrayRelease", "metadata": meta, "status": status}
        try:
            obj = client.CustomObjectsApi(self._api()).replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "grayreleases", name, body
            )
        except ApiException as e:
            if e.status == 409:
                raise ConflictError(f"grayrelease {namespace}/{name} changed since it was read") from None
            raise
        rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
        return str(rv) if rv else None


@dataclass(frozen=True)
class FoundTable:
    """A routing-table ConfigMap as the watch last saw it."""

    name: str
    version: int
    digest: str | None
    table: RoutingTable | None
    #: The ConfigMap's creation time (epoch seconds): of two tables claiming a model, routers
    #: give it to the older.
    created: float = 0.0
    #: The operator's record of the last status it wrote for the release.
    record: Record | None = None

    @property
    def standing(self) -> bool:
        return self.table is not None and self.table.standing


def _found(cm: Any) -> FoundTable:
    from tinct.operator.grayrelease.tables import content_digest

    meta = cm.metadata
    annotations = meta.annotations or {}
    try:
        version = int(annotations.get(VERSION_ANNOTATION, "0"))
    except ValueError:
        version = 0
    doc = (cm.data or {}).get(DATA_KEY)
    table: RoutingTable | None = None
    if doc:
        try:
            table = parse_table(doc, f"configmap {meta.namespace}/{meta.name}")
        except RoutingTableError:
            table = None
    digest = (
        content_digest(table) if table is not None else hashlib.sha256(json.dumps(doc).encode()).hexdigest()
    )
    if table is not None:
        version = max(version, table.version)
    created = meta.creation_timestamp.timestamp() if meta.creation_timestamp is not None else 0.0
    return FoundTable(
        meta.name, version, digest, table, created, parse_record(annotations.get(RECORD_ANNOTATION))
    )


class TableWatch(Following):
    """The routing-table ConfigMaps of ``namespace``, kept current by list+watch in a thread."""

    def __init__(self, namespace: str, api: Callable[[], Any]) -> None:
        self.namespace = namespace
        self.api = api
        self.tables: dict[str, FoundTable] = {}
        #: The first listing arrived: absence in :attr:`tables` means absence in the cluster.
        self.synced = threading.Event()
        self._watch = ListWatch(
            self._list_call,
            selector=f"{TABLE_LABEL}=true",
            on_list=self._listed,
            on_event=self._event,
            what=f"routing tables in namespace {namespace}",
            log=_log,
            name="tinct-table-watch",
        )

    def get(self, name: str) -> FoundTable | None:
        return self.tables.get(name)

    def put(self, name: str, table: RoutingTable, record: Record | None = None) -> None:
        """Take a table (and record) just applied as found (the watch confirms it shortly)."""
        from tinct.operator.grayrelease.tables import content_digest

        old = self.tables.get(name)
        created = old.created if old is not None else time.time()
        self.tables[name] = FoundTable(name, table.version, content_digest(table), table, created, record)

    def forget(self, name: str) -> None:
        self.tables.pop(name, None)

    def _list_call(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        from kubernetes import client

        return client.CoreV1Api(self.api()).list_namespaced_config_map, {"namespace": self.namespace}

    def _listed(self, items: list[Any]) -> None:
        self.tables = {cm.metadata.name: _found(cm) for cm in items}
        self.synced.set()

    def _event(self, kind: str, cm: Any) -> None:
        if kind == "DELETED":
            self.tables.pop(cm.metadata.name, None)
            return
        found, old = _found(cm), self.tables.get(cm.metadata.name)
        kept = old.record if old is not None else None
        newer = found.record
        if (
            kept is not None
            and newer is not None
            and newer.uid == kept.uid
            and newer.sequence < kept.sequence
        ):
            # An event of an earlier write arriving after our own apply: the record goes on.
            found = dataclasses.replace(found, record=kept)
        self.tables[cm.metadata.name] = found

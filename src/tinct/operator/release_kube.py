"""The Kubernetes API calls of the GrayRelease controller, on the synchronous client.

Every method blocks; the controller runs them in a thread pool. Reads return the objects
as plain JSON dicts (camelCase, as the API server sends them) or None when absent; writes
of children are server-side applies under the field manager :data:`FIELD_MANAGER`, so a
retried reconcile converges instead of duplicating.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from tinct.api.v1alpha1.common import GROUP, VERSION

__all__ = ["FIELD_MANAGER", "ReleaseKube"]

FIELD_MANAGER = "tinct-operator"
_APPLY = "application/apply-patch+yaml"


class ReleaseKube:
    """Lazily connected; one instance serves every release of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                from kubernetes import client, config

                try:
                    config.load_incluster_config()  # type: ignore[no-untyped-call]
                except config.ConfigException:
                    config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
                self._client = client.ApiClient()
            return self._client

    def _get(self, call: Any, *args: Any) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = call(*args, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api())

    def modelversion(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes import client

        api = client.CustomObjectsApi(self._api())
        return self._get(api.get_namespaced_custom_object, GROUP, VERSION, namespace, "modelversions", name)

    def service_exists(self, namespace: str, name: str) -> bool:
        return self._get(self._core().read_namespaced_service, name, namespace) is not None

    def deployment_exists(self, namespace: str, name: str) -> bool:
        from kubernetes import client

        api = client.AppsV1Api(self._api())
        return self._get(api.read_namespaced_deployment, name, namespace) is not None

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._core().read_namespaced_config_map, name, namespace)

    def apply_configmap(self, manifest: dict[str, Any]) -> None:
        meta = manifest["metadata"]
        self._core().patch_namespaced_config_map(
            meta["name"],
            meta["namespace"],
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )

    def hpas(self, namespace: str) -> list[dict[str, Any]]:
        from kubernetes import client

        api = client.AutoscalingV2Api(self._api())
        resp: Any = api.list_namespaced_horizontal_pod_autoscaler(namespace, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items", [])
        return items

    def apply_hpa(self, manifest: dict[str, Any]) -> None:
        from kubernetes import client

        meta = manifest["metadata"]
        client.AutoscalingV2Api(self._api()).patch_namespaced_horizontal_pod_autoscaler(
            meta["name"],
            meta["namespace"],
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch ``status`` of a GrayRelease; ``None`` values remove fields."""
        from kubernetes import client

        client.CustomObjectsApi(self._api()).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "grayreleases", name, {"status": status}
        )

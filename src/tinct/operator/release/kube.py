"""The Kubernetes API calls of the GrayRelease controller, on the synchronous client.

Every method blocks; the controller runs them in a thread pool. It only writes: what it
reads comes from kopf's indices. Children are server-side applied under the field manager
:data:`FIELD_MANAGER`, so a retried reconcile converges instead of duplicating.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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

    def apply_hpa(self, manifest: dict[str, Any]) -> None:
        from kubernetes import client

        self._apply(client.AutoscalingV2Api(self._api()).patch_namespaced_horizontal_pod_autoscaler, manifest)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch ``status`` of a GrayRelease; ``None`` values remove fields."""
        from kubernetes import client

        client.CustomObjectsApi(self._api()).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "grayreleases", name, {"status": status}
        )

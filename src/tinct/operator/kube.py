"""Status patches outside kopf's once-per-handler patch (progress during long hashing).

Uses the synchronous ``kubernetes`` client; every call here blocks and is meant for an
executor thread.
"""

from __future__ import annotations

import logging
from typing import Any

from tinct.api.v1alpha1.common import GROUP, VERSION

__all__ = ["StatusPatcher"]

log = logging.getLogger(__name__)


class StatusPatcher:
    """Merge-patches ``status`` of a namespaced custom resource."""

    def __init__(self, plural: str) -> None:
        self.plural = plural
        self._api: Any = None

    def _client(self) -> Any:
        if self._api is None:
            import os

            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                # KUBECONFIG is read now: the library's default froze it at import time.
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
            self._api = client.CustomObjectsApi()
        return self._api

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Best effort: a failed progress update is logged, never fatal."""
        try:
            self._client().patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, self.plural, name, {"status": status}
            )
        except Exception as exc:
            log.debug("status patch of %s/%s failed: %s", namespace, name, exc)

"""Status patches outside kopf's once-per-handler patch (progress during long hashing), and
the list of a namespace's objects a handler compares with (a version's predecessors).

Uses the synchronous ``kubernetes`` client with the cluster access of
:mod:`tinct.kubeconfig`; every call here blocks and is meant for an executor thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.kubeconfig import api_client

__all__ = ["StatusPatcher"]

log = logging.getLogger(__name__)


class StatusPatcher:
    """Merge-patches ``status`` of tinct's namespaced custom resources."""

    def __init__(self) -> None:
        self._api: Any = None
        self._lock = threading.Lock()

    def _client(self) -> Any:
        with self._lock:
            if self._api is None:
                from kubernetes import client

                self._api = client.CustomObjectsApi(api_client())
            return self._api

    def patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        """The object after the patch; None when the patch failed (logged, never raised).

        With ``resource_version``, the patch applies only to the object as it was then (a
        409 Conflict otherwise, which is a failure here too)."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            obj: dict[str, Any] = self._client().patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, body
            )
        except Exception as exc:
            log.debug("status patch of %s %s/%s failed: %s", plural, namespace, name, exc)
            return None
        return obj

    def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The ``plural`` object ``namespace/name``; None when there is none.

        Raises:
            Exception: whatever else the API client raised.
        """
        from kubernetes.client.exceptions import ApiException

        try:
            got: dict[str, Any] = self._client().get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return got

    def list_objects(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        """Every ``plural`` object in ``namespace``.

        Raises:
            Exception: whatever the API client raised; the caller decides what it means.
        """
        got: dict[str, Any] = self._client().list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        items: list[dict[str, Any]] = got.get("items", [])
        return items

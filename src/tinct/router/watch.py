"""Routing tables from ConfigMaps, watched through the Kubernetes API.

The sync ``kubernetes`` client runs list+watch in one daemon thread
(:class:`~tinct.kubewatch.ListWatch`: relisting on 410, resuming, backing off). It was chosen over a
hand-written aiohttp watch because it already knows every way a router authenticates
(in-cluster service account with token rotation, kubeconfig with exec plugins, client
certificates), and the watch carries a few events per rollout step, so one thread costs
nothing on the data path. The thread parses and validates each table (pydantic work stays
off the event loop) and hands the result to the loop with ``call_soon_threadsafe``; the
swap itself is one assignment on the loop.

Several ConfigMaps may match the selector (e.g. cluster-wide): one router serves them all,
each table the OpenAI ``model`` names it lists (:class:`~tinct.router.table.TableHolder`).
Two tables claiming one model: the model belongs to the namespace that first routed it (or
that ``--model-owner`` gives it), where a live table wins over a standing one and the older
ConfigMap (by creation time) keeps it (:mod:`tinct.api.ownership`); the other gets a Warning
Event ``ModelConflict``.
A table is rejected (log line, counter, and a Warning Event ``InvalidRoutingTable`` on the
ConfigMap when RBAC lets the router create events) when it is invalid, when its version
goes back (or its content changes under a version seen before) for its release, when
the ConfigMap holding it is not the one named for its release
(:func:`~tinct.api.routing.configmap_name`): a copy of a release's table under another
name never routes, or when a backend it names is outside its release's namespace and the
router's ``--allow-backend`` list (:class:`~tinct.api.backends.BackendPolicy`). The
ConfigMap's last valid table stays. A deleted ConfigMap's table leaves force, except the
last one, which stays: a router without a table could only answer 503.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinct.api.backends import BackendPolicy
from tinct.api.routing import DATA_KEY, RoutingTable, RoutingTableError, configmap_name, parse_table
from tinct.kubeconfig import api_client
from tinct.kubewatch import Following, ListWatch
from tinct.router.table import TableHolder, TableRefusedError

_log = logging.getLogger(__name__)

EVENT_REASON = "InvalidRoutingTable"
#: Event reason on a table whose models an older table already serves.
CONFLICT_REASON = "ModelConflict"


class ConfigMapWatch(Following):
    """Keeps ``holder`` on the table of the ConfigMaps matching ``selector``."""

    def __init__(
        self,
        holder: TableHolder,
        loop: asyncio.AbstractEventLoop,
        *,
        namespace: str | None,
        selector: str,
        kubeconfig: Path | None = None,
        context: str | None = None,
        post_events: bool = True,
        backends: BackendPolicy | None = None,
    ) -> None:
        self.holder = holder
        #: Which backends a table may name: its release's namespace's Services, and what the
        #: allow-list adds; a table naming another is rejected.
        self.backends = backends or BackendPolicy()
        #: Post Warning Events (off in all workers of a router but one, so each is posted once).
        self.post_events = post_events
        self.loop = loop
        self.namespace = namespace
        self.selector = selector
        self.kubeconfig = kubeconfig
        self.context = context
        #: Valid table per ConfigMap ``namespace/name``; touched on the loop only.
        self.tables: dict[str, RoutingTable] = {}
        self._api: Any = None
        self._watch = ListWatch(
            self._list_call,
            selector=selector,
            on_list=self._listed,
            on_event=self._handle,
            what="routing tables",
            log=_log,
            name="tinct-table-watch",
        )

    # --- on the loop -------------------------------------------------------------------

    def _put(self, key: str, table: RoutingTable, created: float = 0.0, cm: Any = None) -> None:
        source = f"configmap {key}"
        entry = self.holder.tables.get(source)
        if entry is not None and entry[1].table == table:
            return  # a relist or resync: nothing changed
        try:
            _, lost = self.holder.put(source, table, created)
        except TableRefusedError as e:  # rejected (logged, counted) by the holder
            if cm is not None:
                self.loop.run_in_executor(None, self._event, cm, EVENT_REASON, _rejected(e.reason))
            return
        self.tables[key] = table
        if lost:
            message = (
                f"models {', '.join(lost)} are served by another routing table (of the namespace "
                "that first routed them or a cluster administrator gave them, a live one before "
                "a standing one, an older one before a newer); this table does not serve them"
            )
            _log.warning("routing table %s: %s", key, message)
            if cm is not None:
                self.loop.run_in_executor(None, self._event, cm, CONFLICT_REASON, message)

    def _reject(self, key: str, reason: str) -> None:
        self.holder.reject(f"configmap {key}", reason)

    def _delete(self, key: str) -> None:
        if self.tables.pop(key, None) is not None:
            _log.info("routing table ConfigMap %s deleted", key)
        self.holder.remove(f"configmap {key}")

    def _sync(self, keys: set[str]) -> None:
        for gone in set(self.tables) - keys:
            self._delete(gone)
        self.holder.synced = True

    # --- in the thread -----------------------------------------------------------------

    def _post(self, fn: Any, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed during shutdown
            self._watch.stop()

    def _handle(self, kind: str, cm: Any) -> None:
        meta = cm.metadata
        key = f"{meta.namespace}/{meta.name}"
        if kind == "DELETED":
            self._post(self._delete, key)
            return
        data = (cm.data or {}).get(DATA_KEY)
        if data is None:
            reason = f"no {DATA_KEY!r} key in data"
        else:
            try:
                table = parse_table(data, f"configmap {key}")
            except RoutingTableError as e:
                reason = e.reason
            else:
                expected = configmap_name(table.namespace or "default", table.release)
                sides = [("stable", table.stable.url), ("candidate", table.candidate.url)]
                refused = self.backends.refusals(sides, table.namespace)
                if meta.name != expected:
                    reason = (
                        f"the table of {table.namespace or 'default'}/{table.release} belongs in the "
                        f"ConfigMap {expected!r}, not {meta.name!r}"
                    )
                elif refused:
                    reason = "; ".join(refused)
                else:
                    created = meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0
                    self._post(self._put, key, table, created, cm)
                    return
        self._post(self._reject, key, reason)
        self._event(cm, EVENT_REASON, _rejected(reason))

    def _event(self, cm: Any, event_reason: str, message: str) -> None:
        if not self.post_events:
            return
        from kubernetes.client.exceptions import ApiException

        meta = cm.metadata
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.name}.", "namespace": meta.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": meta.name,
                "namespace": meta.namespace,
                "uid": meta.uid,
                "resourceVersion": meta.resource_version,
            },
            "reason": event_reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": "tinct-router", "host": socket.gethostname()},
            "reportingComponent": "tinct-router",
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._core().create_namespaced_event(meta.namespace, body)
        except ApiException as e:
            _log.info(
                "could not post the %s event on %s/%s: %s", event_reason, meta.namespace, meta.name, e.status
            )
        except Exception as e:  # an event is a courtesy; never let it stop the watch
            _log.info("could not post the %s event: %r", event_reason, e)

    def _core(self) -> Any:
        from kubernetes import client

        if self._api is None:
            self._api = client.CoreV1Api(api_client(self.kubeconfig, self.context))
        return self._api

    def _list_call(self) -> tuple[Any, dict[str, Any]]:
        api = self._core()
        if self.namespace:
            return api.list_namespaced_config_map, {"namespace": self.namespace}
        return api.list_config_map_for_all_namespaces, {}

    def _listed(self, items: list[Any]) -> None:
        for cm in items:
            self._handle("ADDED", cm)
        self._post(self._sync, {f"{c.metadata.namespace}/{c.metadata.name}" for c in items})


def _rejected(reason: str) -> str:
    """The message of an ``InvalidRoutingTable`` Event."""
    return f"routing table rejected, the last valid one stays in force: {reason}"


__all__ = ["CONFLICT_REASON", "EVENT_REASON", "ConfigMapWatch"]

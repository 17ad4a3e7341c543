"""The router follows routing-table ConfigMaps on the real API server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from router_fakes import FakeScheduler, running_router, table
from tinct.api.routing import DATA_KEY, routing_configmap
from tinct.router.config import RouterConfig
from tinct.router.watch import CONFLICT_REASON, EVENT_REASON

WAIT = 60.0  # upper bound for the watch to deliver; never a measured figure
#: The fake schedulers listen on loopback, which tables may name only by the allow-list.
LOOPBACK = ("127.0.0.1/32",)


async def eventually(check: Callable[[], Any], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


def apply(cluster: Any, namespace: str, cm: dict[str, Any]) -> None:
    cm["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=json.dumps(cm))


async def side(http: aiohttp.ClientSession, base: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers={"X-Session-Id": "s-1"}) as r:
        assert r.status == 200
        return r.headers["X-Scheduler-Active"]


async def test_configmap_updates_change_routing_and_invalid_tables_are_rejected(
    cluster: Any, namespace: str, backends: tuple[FakeScheduler, FakeScheduler]
) -> None:
    v1, v2 = backends
    cfg = RouterConfig(
        watch=True, namespace=namespace, kubeconfig=cluster.kubeconfig, allow_backends=LOOPBACK
    )
    async with running_router(None, cfg) as (base, app), aiohttp.ClientSession() as http:
        holder = app.state.holder
        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=1, default_weight=0)))
        await eventually(lambda: holder.current is not None and holder.current.version == 1, "table v1")
        async with http.get(f"{base}/readyz") as r:
            assert r.status == 200
        assert await side(http, base) == "v1"

        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=2, default_weight=100)))
        await eventually(lambda: holder.current is not None and holder.current.version == 2, "table v2")
        assert await side(http, base) == "v2"

        rejections: list[str] = []
        holder.on_reject.append(lambda src, why: rejections.append(why))
        bad = routing_configmap(table(v1.url, v2.url, version=3, default_weight=0))
        doc = json.loads(bad["data"][DATA_KEY])
        doc["cells"].append({"match": {"role": "*"}, "weight": 0})  # a second default cell
        bad["data"][DATA_KEY] = json.dumps(doc)
        apply(cluster, namespace, bad)
        await eventually(lambda: rejections, "the invalid table to be rejected")
        assert "exactly one default cell" in rejections[0]
        assert holder.current is not None
        assert holder.current.version == 2
        assert await side(http, base) == "v2"

        def event_posted() -> bool:
            out = cluster.kubectl(
                "get", "events", "-n", namespace, "--field-selector", f"reason={EVENT_REASON}", "-o", "json"
            ).stdout
            return any("exactly one default cell" in e["message"] for e in json.loads(out)["items"])

        await eventually(event_posted, "the InvalidRoutingTable event")

        # A valid table after the bad one is taken again.
        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=4, default_weight=0)))
        await eventually(lambda: holder.current is not None and holder.current.version == 4, "table v4")
        assert await side(http, base) == "v1"


async def test_router_is_ready_without_tables_once_it_listed_none_and_answers_503(
    cluster: Any, namespace: str, backends: tuple[FakeScheduler, FakeScheduler]
) -> None:
    """A fresh install has no release yet: its routers must still become Ready (helm --wait)."""
    v1, v2 = backends
    cfg = RouterConfig(
        watch=True, namespace=namespace, kubeconfig=cluster.kubeconfig, allow_backends=LOOPBACK
    )
    async with running_router(None, cfg) as (base, app), aiohttp.ClientSession() as http:
        holder = app.state.holder
        await eventually(lambda: holder.synced, "the first listing of routing tables")
        async with http.get(f"{base}/readyz") as r:
            assert r.status == 200, await r.text()
            assert "no routing table exists yet" in await r.text()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{base}/v1/chat/completions", json=body) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "no_routing_table"
        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=1, default_weight=0)))
        await eventually(lambda: holder.current is not None, "the first table")
        async with http.get(f"{base}/readyz") as r:
            assert "table version 1" in await r.text()
        assert await side(http, base) == "v1"


async def test_router_with_least_privilege_service_account(
    cluster: Any,
    namespace: str,
    backends: tuple[FakeScheduler, FakeScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """get/list/watch on ConfigMaps is all the router needs; a forbidden Event is only logged."""
    v1, v2 = backends
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tinct-router", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tinct-router", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tinct-router"},
            "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": namespace}],
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    kubeconfig = cluster.service_account_kubeconfig(namespace, "router")
    cfg = RouterConfig(watch=True, namespace=namespace, kubeconfig=kubeconfig, allow_backends=LOOPBACK)
    async with running_router(None, cfg) as (base, app), aiohttp.ClientSession() as http:
        holder = app.state.holder
        rejections: list[str] = []
        holder.on_reject.append(lambda src, why: rejections.append(why))
        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=1, default_weight=100)))
        await eventually(lambda: holder.current is not None, "the table")
        assert await side(http, base) == "v2"
        cm = routing_configmap(table(v1.url, v2.url, version=2))
        cm["data"][DATA_KEY] = "{not json"
        caplog.set_level(logging.INFO, logger="tinct.router.watch")
        apply(cluster, namespace, cm)
        await eventually(lambda: rejections, "the rejection")
        assert holder.current is not None
        assert holder.current.version == 1
        assert await side(http, base) == "v2"

        # The Event is forbidden: the refusal is logged (403), nothing is posted, the watch goes on.
        def forbidden_logged() -> bool:
            return any(
                f"could not post the {EVENT_REASON} event" in r.getMessage() and "403" in r.getMessage()
                for r in caplog.records
            )

        await eventually(forbidden_logged, "the forbidden Event to be logged")
        out = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        assert [e for e in json.loads(out)["items"] if e.get("reason") == EVENT_REASON] == []
        assert not [
            r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "tinct.router.watch"
        ]
        apply(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=3, default_weight=0)))
        await eventually(lambda: holder.current is not None and holder.current.version == 3, "table v3")
        assert await side(http, base) == "v1"


async def test_one_router_follows_every_release_and_the_older_table_keeps_a_contested_model(
    cluster: Any, namespace: str, backends: tuple[FakeScheduler, FakeScheduler]
) -> None:
    v1, v2 = backends
    cfg = RouterConfig(
        watch=True, namespace=namespace, kubeconfig=cluster.kubeconfig, allow_backends=LOOPBACK
    )
    async with running_router(None, cfg) as (base, app), aiohttp.ClientSession() as http:
        holder = app.state.holder
        # "zeta" is created first and sorts last: only its age can make it win.
        older = table(v1.url, v2.url, release="zeta", models=["llama3-8b"])
        apply(cluster, namespace, routing_configmap(older))
        await eventually(lambda: holder.for_model("llama3-8b") is not None, "the first table")
        await asyncio.sleep(1.1)  # creation timestamps have a one-second resolution
        newer = table(v2.url, v1.url, release="alpha", models=["llama3-8b", "coder-7b"])
        apply(cluster, namespace, routing_configmap(newer))
        await eventually(lambda: holder.for_model("coder-7b") is not None, "the second table")

        async def served_by(model: str) -> str:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                return str((await r.json())["model"])

        assert await served_by("llama3-8b") == "v1"  # the older table's stable
        assert await served_by("coder-7b") == "v2"  # the newer table's stable
        async with http.post(f"{base}/v1/chat/completions", json={"model": "nope", "messages": []}) as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "model_not_found"

        def conflict_event() -> list[dict[str, Any]]:
            out = cluster.kubectl(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                f"reason={CONFLICT_REASON}",
                "-o",
                "json",
            ).stdout
            return list(json.loads(out)["items"])

        await eventually(conflict_event, "the ModelConflict event")
        (event,) = conflict_event()
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "tinct-routing-llm.alpha"
        assert "llama3-8b" in event["message"]

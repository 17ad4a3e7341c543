"""Tables from a file: load, reload on change/SIGHUP, reject a bad one and keep the last good."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from tinct.api.backends import BackendPolicy, parse_allowed
from tinct.api.routing import DATA_KEY, RoutingTable, configmap_name
from tinct.cli import build_parser
from tinct.router.config import RouterConfig
from tinct.router.sources import FileTable
from tinct.router.table import TableHolder
from tinct_testing.router_fakes import running_router, table_doc
from tinct_testing.wait import eventually_async


def test_file_table_reload_keeps_the_last_good_table(tmp_path: Path) -> None:
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc("http://127.0.0.1:1", "http://127.0.0.1:2", version=1)))
    holder = TableHolder()
    rejected: list[str] = []
    holder.on_reject.append(lambda src, why: rejected.append(why))
    ft = FileTable(f, holder)
    assert ft.load()
    assert holder.current is not None
    assert holder.current.version == 1
    assert not ft.changed()

    f.write_text(
        json.dumps(table_doc("http://127.0.0.1:1", "http://127.0.0.1:2", version=2, default_weight=5))
    )
    assert ft.changed()
    assert ft.load()
    assert holder.current.version == 2
    assert holder.current.routes[("short", "user", "low")].weight == 5

    f.write_text('{"schema": "tinct.io/routing/v1", "release": "chat"}')
    assert not ft.load()
    assert holder.current.version == 2
    assert rejected
    assert "stable" in rejected[0]


async def test_router_reads_its_table_file_at_startup(tmp_path: Path) -> None:
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc("http://127.0.0.1:1", "http://127.0.0.1:2", version=3)))
    async with running_router(None, RouterConfig(table_files=(f,))) as (base, app):
        async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as r:
            assert r.status == 200
            assert "version 3" in await r.text()
        f.write_text("garbage")
        for reload in app.state.reloaders:
            reload()
        holder = app.state.holder
        assert holder.current is not None
        assert holder.current.version == 3
        async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
            assert "tinct_router_table_rejections_total 1.0" in await r.text()


def test_cli_registers_the_router_command() -> None:
    from tinct.router.cli import config_from_args

    args = build_parser().parse_args(["router", "--table", "a.json", "--table", "b.json", "--port", "9000"])
    assert args.command == "router"
    cfg = config_from_args(args)
    assert cfg.table_files == (Path("a.json"), Path("b.json"))
    assert cfg.port == 9000
    args = build_parser().parse_args(["router", "--watch", "--namespace", "llm"])
    cfg = config_from_args(args)
    assert cfg.watch
    assert cfg.namespace == "llm"
    # Every other setting is RouterConfig's own default.
    assert cfg == RouterConfig(watch=True, namespace="llm")
    assert cfg.selector == "tinct.io/routing-table=true"


async def test_watch_keeps_one_table_per_configmap_and_routes_with_the_first() -> None:
    import asyncio

    from tinct.router.watch import ConfigMapWatch

    holder = TableHolder()
    w = ConfigMapWatch(
        holder, asyncio.get_running_loop(), namespace=None, selector="tinct.io/routing-table=true"
    )
    a = parse(table_doc("http://127.0.0.1:1", "http://127.0.0.1:2", version=1, release="a"))
    b = parse(table_doc("http://127.0.0.1:3", "http://127.0.0.1:4", version=9, release="b"))
    w._put("llm/tinct-routing-llm.b", b)
    assert holder.current is not None
    assert holder.current.release == "b"
    w._put("llm/tinct-routing-llm.a", a)
    assert holder.current.release == "a"  # first by namespace/name
    w._reject("llm/tinct-routing-llm.a", "broken")
    assert holder.current.release == "a"
    w._delete("llm/tinct-routing-llm.a")
    assert holder.current.release == "b"
    w._sync(set())  # a relist that finds nothing: the last table stays in force
    assert holder.current.release == "b"
    assert w.tables == {}


def parse(doc: dict[str, object]) -> RoutingTable:
    return RoutingTable.model_validate(doc)


def _configmap(name: str, doc: dict[str, object], namespace: str = "tinct-system") -> Any:
    meta = SimpleNamespace(
        namespace=namespace, name=name, creation_timestamp=None, uid=f"cm-{name}", resource_version="1"
    )
    return SimpleNamespace(metadata=meta, data={DATA_KEY: json.dumps(doc)})


async def test_watch_refuses_a_table_under_another_name_and_one_going_back() -> None:
    import asyncio

    from tinct.router.watch import EVENT_REASON, ConfigMapWatch

    holder = TableHolder()
    rejected: list[str] = []
    holder.on_reject.append(lambda src, why: rejected.append(why))
    # The tables name schedulers on loopback, which the allow-list lets them.
    loopback = BackendPolicy(parse_allowed(["127.0.0.1"]))
    w = ConfigMapWatch(
        holder, asyncio.get_running_loop(), namespace=None, selector="x", post_events=False, backends=loopback
    )
    events: list[tuple[str, str, str]] = []
    w._event = lambda cm, reason, message: events.append((cm.metadata.name, reason, message))  # type: ignore[method-assign]

    async def handle(cm: Any) -> None:
        w._handle("ADDED", cm)  # as the watch thread does; what it posts runs on this loop
        for _ in range(5):
            await asyncio.sleep(0)

    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    chat = table_doc(*ab, version=3, uid="u-1", models=["m"])
    await handle(_configmap(configmap_name("llm", "chat"), chat))
    assert holder.for_model("m") is not None
    assert rejected == []

    # A copy of chat's table under another release's name does not route.
    copy = table_doc(*ab, version=4, uid="u-1", models=["m", "stolen"])
    await handle(_configmap(configmap_name("llm", "code"), copy))
    assert holder.for_model("stolen") is None
    assert "belongs in the ConfigMap 'tinct-routing-llm.chat', not 'tinct-routing-llm.code'" in rejected[-1]
    assert events[-1][:2] == ("tinct-routing-llm.code", EVENT_REASON)

    # The right ConfigMap, deleted and recreated with an older version: refused, evented.
    w._handle("DELETED", _configmap(configmap_name("llm", "chat"), chat))
    await handle(
        _configmap(configmap_name("llm", "chat"), table_doc(*ab, version=2, uid="u-1", models=["m"]))
    )
    assert "version 2 of llm/chat (uid u-1) goes back: version 3" in rejected[-1]
    # The Event is posted from a worker thread.
    await eventually_async(
        lambda: len(events) >= 2, timeout=30, interval=0.01, what="the refused table's Event"
    )
    assert events[-1][:2] == ("tinct-routing-llm.chat", EVENT_REASON)
    assert "goes back" in events[-1][2]
    assert len(rejected) == 2
    assert w.tables == {}, "the refused table is not the ConfigMap's"


async def test_watch_refuses_a_table_naming_a_backend_outside_its_namespace() -> None:
    import asyncio

    from tinct.router.watch import EVENT_REASON, ConfigMapWatch

    holder = TableHolder()
    rejected: list[str] = []
    holder.on_reject.append(lambda src, why: rejected.append(why))
    w = ConfigMapWatch(
        holder,
        asyncio.get_running_loop(),
        namespace=None,
        selector="x",
        post_events=False,
        backends=BackendPolicy(parse_allowed("*.shared.example")),
    )
    events: list[tuple[str, str, str]] = []
    w._event = lambda cm, reason, message: events.append((cm.metadata.name, reason, message))  # type: ignore[method-assign]

    async def handle(doc: dict[str, Any]) -> None:
        w._handle("ADDED", _configmap(configmap_name("llm", "chat"), doc))
        for _ in range(5):
            await asyncio.sleep(0)

    own = ("http://sched-v1.llm.svc.cluster.local:8000", "http://sched-v2.llm.svc:8000")
    await handle(table_doc(*own, version=1, uid="u-1", models=["m"]))
    assert holder.for_model("m") is not None
    for stable, candidate in (
        (own[0], "http://sched-v1.other.svc.cluster.local:8000"),  # another tenant's Service
        (own[0], "http://127.0.0.1:8000"),  # the router's own loopback
        ("http://sched-v1:8000", own[1]),  # a bare name: the router's namespace
        (own[0], "http://sched-v2.llm.svc.evil.example:8000"),  # not the cluster's domain
    ):
        await handle(table_doc(stable, candidate, version=2, uid="u-1", models=["m"]))
        assert "is outside the release's namespace" in rejected[-1], (stable, candidate)
    assert len(rejected) == 4
    assert events[-1][:2] == ("tinct-routing-llm.chat", EVENT_REASON)
    got = holder.for_model("m")
    assert got is not None
    assert got.version == 1, "the last valid table stays"
    await handle(table_doc(own[0], "https://api.shared.example:443", version=3, uid="u-1", models=["m"]))
    got = holder.for_model("m")
    assert got is not None
    assert got.version == 3, "an allowed outside host"


def test_a_table_file_going_back_in_version_is_rejected_and_the_newer_table_stays(tmp_path: Path) -> None:
    f = tmp_path / "table.json"
    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    f.write_text(json.dumps(table_doc(*ab, version=7)))
    holder = TableHolder()
    rejected: list[str] = []
    holder.on_reject.append(lambda src, why: rejected.append(why))
    ft = FileTable(f, holder)
    assert ft.load()
    f.write_text(json.dumps(table_doc(*ab, version=6, default_weight=100)))
    assert not ft.load()
    assert holder.current is not None
    assert holder.current.version == 7
    assert "goes back" in rejected[0]

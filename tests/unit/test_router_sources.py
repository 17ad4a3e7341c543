"""Tables from a file: load, reload on change/SIGHUP, reject a bad one and keep the last good."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from router_fakes import running_router, table_doc
from tinct.api.routing import RoutingTable
from tinct.cli import build_parser
from tinct.router.config import RouterConfig
from tinct.router.sources import FileTable
from tinct.router.table import TableHolder


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
    w._put("llm/tinct-routing-b", b)
    assert holder.current is not None
    assert holder.current.release == "b"
    w._put("llm/tinct-routing-a", a)
    assert holder.current.release == "a"  # first by namespace/name
    w._reject("llm/tinct-routing-a", "broken")
    assert holder.current.release == "a"
    w._delete("llm/tinct-routing-a")
    assert holder.current.release == "b"
    w._sync(set())  # a relist that finds nothing: the last table stays in force
    assert holder.current.release == "b"
    assert w.tables == {}


def parse(doc: dict[str, object]) -> RoutingTable:
    return RoutingTable.model_validate(doc)

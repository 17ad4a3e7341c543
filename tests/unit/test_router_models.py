"""One router, several releases: the request's OpenAI ``model`` picks the routing table."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from router_fakes import FakeScheduler, router_process, running_router, table, table_doc
from tinct.api.routing import RoutingTable
from tinct.router.table import TableHolder


def _chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


async def test_one_router_process_serves_two_releases_by_model_name(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    # Release "chat" is served by v1 (weight 0), release "code" by v2 (its stable).
    a = tmp_path / "chat.json"
    a.write_text(json.dumps(table_doc(v1.url, v2.url, release="chat", models=["llama3-8b"])))
    b = tmp_path / "code.json"
    b.write_text(json.dumps(table_doc(v2.url, v1.url, release="code", models=["coder-7b", "coder-7b-fast"])))
    async with (
        router_process(str(a), "--table", str(b)) as rp,
        aiohttp.ClientSession() as http,
    ):
        served = {}
        for model in ("llama3-8b", "coder-7b", "coder-7b-fast"):
            async with http.post(f"{rp.base}/v1/chat/completions", json=_chat(model)) as r:
                assert r.status == 200
                served[model] = (await r.json())["model"]
        assert served == {"llama3-8b": "v1", "coder-7b": "v2", "coder-7b-fast": "v2"}
        seen = len(v1.seen) + len(v2.seen)
        async with http.post(f"{rp.base}/v1/chat/completions", json=_chat("gpt-unknown")) as r:
            assert r.status == 404
            err = (await r.json())["error"]
        assert err["code"] == "model_not_found"
        assert err["type"] == "invalid_request_error"
        assert "gpt-unknown" in err["message"]
        assert len(v1.seen) + len(v2.seen) == seen  # no backend saw it
        async with http.get(f"{rp.base}/metrics") as r:
            text = await r.text()
        assert 'release="code"' in text
        assert 'release="chat"' in text
        # Paths without a model go to the default (oldest: first on the command line) table.
        async with http.get(f"{rp.base}/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "v1"


async def test_two_tables_claiming_one_model_the_older_keeps_it(v1: FakeScheduler, v2: FakeScheduler) -> None:
    holder = TableHolder()
    older = RoutingTable.model_validate(table_doc(v1.url, v2.url, release="chat", models=["m", "x"]))
    newer = RoutingTable.model_validate(table_doc(v2.url, v1.url, release="chat-2", models=["m", "y"]))
    _, lost = holder.put("configmap llm/a", older, created=100.0)
    assert lost == []
    _, lost = holder.put("configmap llm/b", newer, created=200.0)
    assert lost == ["m"]
    for_m, for_y = holder.for_model("m"), holder.for_model("y")
    assert for_m is not None
    assert for_m.release == "chat"
    assert for_y is not None
    assert for_y.release == "chat-2"
    assert holder.for_model("z") is None  # the default table names models: no catch-all
    assert holder.for_model(None) is None
    holder.remove("configmap llm/a")  # the older one goes: the newer gets the model
    for_m = holder.for_model("m")
    assert for_m is not None
    assert for_m.release == "chat-2"


async def test_a_single_table_without_models_routes_every_model(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _), aiohttp.ClientSession() as http:
        for model in ("a", "b"):
            async with http.post(f"{base}/v1/chat/completions", json=_chat(model)) as r:
                assert r.status == 200
        async with http.post(f"{base}/v1/chat/completions", json={"messages": []}) as r:
            assert r.status == 200  # no model at all: the default table

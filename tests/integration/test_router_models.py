"""One router, several releases: the request's OpenAI ``model`` picks the routing table."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tinct.api.routing import RoutingTable
from tinct.router.table import TableHolder
from tinct_testing.router_fakes import FakeScheduler, router_process, running_router, table, table_doc


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
        assert err["message"] == (
            "the model 'gpt-unknown' is not served here (this router serves coder-7b, coder-7b-fast, llama3-8b)"
        )
        # A request naming no model, with several tables naming theirs: no table takes it,
        # and the answer says what to send (not "the model None does not exist").
        async with http.post(f"{rp.base}/v1/chat/completions", json={"messages": []}) as r:
            assert r.status == 400
            err = (await r.json())["error"]
        assert err["code"] == "model_required"
        assert err["message"] == (
            'the request names no model: set "model" (this router serves coder-7b, coder-7b-fast, llama3-8b)'
        )
        assert len(v1.seen) + len(v2.seen) == seen  # no backend saw either
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


def test_a_model_stays_with_the_namespace_that_routed_it_first() -> None:
    ab = ("http://a:1", "http://b:2")
    left = RoutingTable.model_validate(
        table_doc(*ab, namespace="team-b", release="chat", uid="u-b", models=["m"], standing=True)
    )
    live = RoutingTable.model_validate(
        table_doc(*ab, namespace="team-a", release="chat", uid="u-a", models=["m"])
    )
    holder = TableHolder()
    holder.put("configmap tinct/b", left, created=100.0)
    _, lost = holder.put("configmap tinct/a", live, created=200.0)
    # A live table of another namespace does not take a standing route's model.
    assert lost == ["m"]
    got = holder.for_model("m")
    assert got is not None
    assert (got.namespace, got.table.standing) == ("team-b", True)
    # A live table of the owning namespace does.
    nxt = RoutingTable.model_validate(
        table_doc(*ab, namespace="team-b", release="next", uid="u-b2", models=["m"])
    )
    holder.put("configmap tinct/b2", nxt, created=300.0)
    got = holder.for_model("m")
    assert got is not None
    assert (got.namespace, got.release) == ("team-b", "next")
    # The standing route retired, team-b keeps its place by the claim its next table carries.
    holder.remove("configmap tinct/b")
    holder.remove("configmap tinct/b2")
    carried = nxt.model_copy(update={"claimed": {"m": 100.0}, "version": 2})
    holder.put("configmap tinct/b2", carried, created=300.0)
    got = holder.for_model("m")
    assert got is not None
    assert got.namespace == "team-b"
    # A cluster administrator's mapping outranks who came first.
    mapped = TableHolder(owners={"m": "team-a"})
    mapped.put("configmap tinct/b", left, created=100.0)
    mapped.put("configmap tinct/a", live, created=200.0)
    got = mapped.for_model("m")
    assert got is not None
    assert got.namespace == "team-a"


async def test_a_single_table_without_models_routes_every_model(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _), aiohttp.ClientSession() as http:
        for model in ("a", "b"):
            async with http.post(f"{base}/v1/chat/completions", json=_chat(model)) as r:
                assert r.status == 200
        async with http.post(f"{base}/v1/chat/completions", json={"messages": []}) as r:
            assert r.status == 200  # no model at all: the default table


async def test_releases_of_one_name_in_two_namespaces_keep_their_own_series_and_ejection(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    # Two releases "chat", in namespaces "team-a" and "team-b", on the very same backends:
    # only the namespace tells their series, and their candidates' health, apart.
    v2.reset("error")
    fallback = {"consecutiveFailures": 2, "latencyMs": 800, "cooldownSeconds": 300}
    files = []
    for ns, version in (("team-a", 3), ("team-b", 8)):
        f = tmp_path / f"{ns}.json"
        doc = table_doc(
            v1.url,
            v2.url,
            namespace=ns,
            models=[f"m-{ns}"],
            version=version,
            default_weight=100,
            fallback=fallback,
        )
        f.write_text(json.dumps(doc))
        files.append(str(f))
    async with router_process(files[0], "--table", files[1]) as rp, aiohttp.ClientSession() as http:
        reasons = {}
        for model in ("m-team-a", "m-team-a", "m-team-a", "m-team-b"):
            async with http.post(f"{rp.base}/v1/chat/completions", json=_chat(model)) as r:
                assert r.status == 200
                assert r.headers["X-Scheduler-Active"] == "v1"
                reasons.setdefault(model, []).append(r.headers["X-Fallback-Reason"])
        # team-a's candidate failed twice and is ejected; team-b's is tried (and fails) on its own.
        assert reasons == {
            "m-team-a": ["upstream_error", "upstream_error", "ejected"],
            "m-team-b": ["upstream_error"],
        }
        async with http.get(f"{rp.base}/metrics") as r:
            text = await r.text()
    tag = "len:short+role:user+latency:low"
    for line in (
        f'tinct_router_requests_total{{code="200",dye_tag="{tag}",namespace="team-a",release="chat",'
        'scheduler_version="v1",side="stable"} 3.0',
        f'tinct_router_requests_total{{code="200",dye_tag="{tag}",namespace="team-b",release="chat",'
        'scheduler_version="v1",side="stable"} 1.0',
        f'tinct_router_fallbacks_total{{dye_tag="{tag}",namespace="team-a",reason="ejected",release="chat"}} 1.0',
        f'tinct_router_fallbacks_total{{dye_tag="{tag}",namespace="team-b",reason="upstream_error",release="chat"}} 1.0',
        'tinct_router_candidate_ejections_total{namespace="team-a",release="chat"} 1.0',
        'tinct_router_candidate_ejected{namespace="team-a",release="chat"} 1.0',
        'tinct_router_candidate_ejected{namespace="team-b",release="chat"} 0.0',
        'tinct_router_table_version{namespace="team-a",release="chat"} 3.0',
        'tinct_router_table_version{namespace="team-b",release="chat"} 8.0',
        f'tinct_router_time_to_first_byte_seconds_count{{dye_tag="{tag}",namespace="team-a",release="chat",'
        'side="stable"} 3.0',
        f'tinct_router_request_duration_seconds_count{{dye_tag="{tag}",namespace="team-b",release="chat",'
        'side="stable"} 1.0',
    ):
        assert line in text, line
    assert 'tinct_router_candidate_ejections_total{namespace="team-b"' not in text


def test_the_default_release_may_be_named_with_its_namespace() -> None:
    def put(holder: TableHolder) -> None:
        for i, ns in enumerate(("team-a", "team-b")):
            doc = table_doc("http://127.0.0.1:1", "http://127.0.0.1:2", namespace=ns, models=[f"m-{ns}"])
            holder.put(f"file {ns}", RoutingTable.model_validate(doc), created=float(i))

    for name, expected in (("team-b/chat", "team-b"), ("chat", "team-a"), (None, "team-a")):
        holder = TableHolder(default_release=name)
        put(holder)
        assert holder.current is not None
        assert holder.current.namespace == expected, name

"""The engine emulator over real HTTP: the OpenAI client against it, its queue, its metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tinct.emulator import EMULATOR_HEADER, Behaviour, BehaviourError, serving
from tinct.emulator.behaviour import from_env
from tinct.emulator.server import Emulator
from tinct_testing.lora_artifacts import make_adapter
from tinct_testing.wait import eventually_async

CHAT = [{"role": "user", "content": "tell me about dye tags " * 40}]


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    async with serving(Behaviour(model="m1", ttft_ms=0, itl_ms=0, output_tokens=7), control=True) as e:
        yield e


def client(e: Emulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{e.url}/v1", api_key="x", max_retries=0)


async def metrics(e: Emulator) -> dict[str, float]:
    """sample name (with labels) -> value, as a scraper reads them."""
    async with aiohttp.ClientSession() as http, http.get(f"{e.url}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            extra = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + (json.dumps(extra, sort_keys=True) if extra else "")
            out[key] = s.value
    return out


async def test_streams_chat_to_the_openai_client_and_says_it_emulates(emu: Emulator) -> None:
    async with client(emu) as c:
        stream = await c.chat.completions.create(
            model="m1",
            messages=CHAT,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "Emulated answer from m1. Emulated answer"
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
        assert chunks[-1].usage is not None
        assert (chunks[-1].usage.completion_tokens, chunks[-1].choices) == (7, [])
        assert chunks[-1].usage.prompt_tokens == len(CHAT[0]["content"]) // 4
        models = await c.models.with_raw_response.list()
        assert "no model runs" in models.headers[EMULATOR_HEADER.lower()]
        (model,) = models.parse().data
        assert model.id == "m1"
        assert "emulated" in model.owned_by


async def test_answers_whole_chat_and_completions_capped_by_max_tokens(emu: Emulator) -> None:
    async with client(emu) as c:
        chat = await c.chat.completions.create(model="m1", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
        assert chat.choices[0].message.content == "Emulated answer from"
        assert chat.usage is not None
        assert chat.usage.completion_tokens == 3
        done = await c.completions.create(model="m1", prompt="hello " * 100)
        assert done.choices[0].text == "Emulated answer from m1. Emulated answer"
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (150, 7)
        streamed = await c.completions.create(model="m1", prompt="hi", stream=True, max_tokens=2)
        assert "".join([ch.choices[0].text async for ch in streamed]) == "Emulated answer"


async def test_error_and_throttle_shares_are_exact_and_shaped_like_openai(emu: Emulator) -> None:
    emu.set(error_rate=0.25, throttle_rate=0.5, error_status=502)
    async with client(emu) as c:
        seen: dict[str, int] = {}
        for _ in range(8):
            kind = "ok"
            try:
                await c.chat.completions.create(model="m1", messages=CHAT)  # type: ignore[arg-type]
            except openai.APIStatusError as e:
                failed = e
                kind = str(e.status_code)
                if e.status_code == 429:
                    body = failed.body
                    assert isinstance(body, dict)
                    assert body["code"] == "rate_limit_exceeded", "an OpenAI error object"
            seen[kind] = seen.get(kind, 0) + 1
        assert seen == {"502": 2, "429": 3, "ok": 3}, "a quarter fail, half the rest are throttled"


async def test_contract_breaks_are_what_they_say(emu: Emulator) -> None:
    body = {"model": "m1", "messages": CHAT, "stream": True}
    async with aiohttp.ClientSession() as http:

        async def raw(**changes: object) -> tuple[int, str, str]:
            emu.set(**changes)
            async with http.post(f"{emu.url}/v1/chat/completions", json=body) as r:
                return r.status, r.headers.get("Content-Type", ""), await r.text()

        status, _, ok = await raw(contract="ok")
        assert ok.endswith("data: [DONE]\n\n")
        _, _, unframed = await raw(contract="sse-unframed")
        events = [e for e in unframed.split("\n\n") if e]
        assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events), "bare JSON"
        assert "data:" not in unframed
        _, _, no_done = await raw(contract="sse-no-done")
        assert no_done.startswith("data: {")
        assert "[DONE]" not in no_done
        _, _, no_choices = await raw(contract="no-choices")
        assert '"choices"' not in no_choices
        assert no_choices.endswith("data: [DONE]\n\n")
        status, ctype, text = await raw(contract="error-body", throttle_rate=1.0)
        assert (status, ctype.split(";")[0]) == (429, "text/plain")
        assert not text.lstrip().startswith("{"), text
        emu.set(contract="ok", throttle_rate=0, accept_versions=["v2"])
        async with http.post(
            f"{emu.url}/v1/chat/completions", json=body, headers={"X-Scheduler-Version": "v1"}
        ) as r:
            assert r.status == 426
            assert (await r.json())["error"]["code"] == "version_mismatch"


async def test_a_stream_cut_after_tokens_ends_without_its_end(emu: Emulator) -> None:
    emu.set(cut_after_tokens=2)
    body = {"model": "m1", "messages": CHAT, "stream": True}
    got = bytearray()
    async with aiohttp.ClientSession() as http, http.post(f"{emu.url}/v1/chat/completions", json=body) as r:
        cut = False
        try:
            async for data in r.content.iter_any():
                got += data
        except aiohttp.ClientPayloadError:
            cut = True
    assert cut, "the answer ended before its end"
    assert got.count(b'"content":"') == 3  # the role's empty content, then two tokens
    assert b"[DONE]" not in got


async def test_queue_depth_and_kv_cache_move_with_load_and_clients_that_leave(emu: Emulator) -> None:
    """One slot, a long prefill: the first request runs, the others wait; requests whose
    clients leave give their slot and queue place back."""
    emu.set(slots=1, ttft_ms=60_000, kv_capacity_tokens=1000)
    body = {"model": "m1", "messages": CHAT, "stream": True}
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(f"{emu.url}/v1/chat/completions", json=body) as r:
                await r.read()

        tasks = [asyncio.create_task(one()) for _ in range(3)]

        async def loaded() -> bool:
            m = await metrics(emu)
            return m["vllm:num_requests_waiting"] == 2 and m["vllm:num_requests_running"] == 1

        await eventually_async(loaded, timeout=30, interval=0.02, what="one running, two waiting")
        m = await metrics(emu)
        assert m["vllm:kv_cache_usage_perc"] == pytest.approx(len(CHAT[0]["content"]) // 4 / 1000)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def idle() -> bool:
            m = await metrics(emu)
            return (m["vllm:num_requests_waiting"], m["vllm:num_requests_running"]) == (0, 0)

        await eventually_async(
            idle, timeout=30, interval=0.02, what="the queue emptied by the clients leaving"
        )
        assert (await metrics(emu))["vllm:kv_cache_usage_perc"] == 0
        emu.set(ttft_ms=0)
        await one()  # the slot is free again


async def test_metric_names_follow_the_engine(emu: Emulator) -> None:
    async with client(emu) as c:
        for _ in range(4):
            await c.chat.completions.create(model="m1", messages=CHAT)  # type: ignore[arg-type]
        m = await metrics(emu)
        assert m["vllm:request_success_total" + json.dumps({"finished_reason": "stop"})] == 4
        assert m["vllm:prefix_cache_hits_total"] / m["vllm:prefix_cache_queries_total"] == pytest.approx(0.5)
        assert m["vllm:time_to_first_token_seconds_count"] == 4
        assert m["vllm:inter_token_latency_seconds_count"] == 4 * 6
        assert m["vllm:generation_tokens_total"] == 28
        assert "vllm:gpu_cache_usage_perc" not in m

        emu.set(alt_names=True)
        m = await metrics(emu)
        assert {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total"} <= set(m)
        assert "vllm:time_per_output_token_seconds_count" in m
        assert not {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"} & set(m)

        emu.set(engine="sglang", alt_names=False)
        m = await metrics(emu)
        assert {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"} <= set(m)
        assert m["sglang:cache_hit_rate"] == pytest.approx(0.5)
        assert not any(k.startswith("vllm:") for k in m)
        emu.set(alt_names=True)
        assert "sglang_num_queue_reqs" in await metrics(emu)

        emu.set(engine="tgi")
        m = await metrics(emu)
        assert {"tgi_queue_size", "tgi_batch_current_size", "tgi_request_count_total"} <= set(m)
        assert not any("cache" in k for k in m), "TGI exports no cache figure"


async def test_control_is_bounded_validated_and_off_by_default(emu: Emulator) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{emu.url}/emulator/config", json={"ttft_ms": 5, "slots": 2}) as r:
            assert r.status == 200
            assert (await r.json())["slots"] == 2
        async with http.get(f"{emu.url}/emulator/config") as r:
            assert (await r.json())["ttft_ms"] == 5
        for bad in ({"slots": 0}, {"error_rate": 2}, {"engine": "llama.cpp"}, {"nope": 1}):
            async with http.post(f"{emu.url}/emulator/config", json=bad) as r:
                assert r.status == 422, bad
                assert next(iter(bad)) in (await r.json())["error"]
        async with http.post(f"{emu.url}/emulator/config", data=b"{" + b" " * 70_000 + b"}") as r:
            assert r.status == 413
        async with http.post(f"{emu.url}/emulator/config", data=b"[1]") as r:
            assert r.status == 400
        async with http.post(f"{emu.url}/v1/chat/completions", data=b"not json") as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "invalid_json"
        assert emu.state.behaviour.slots == 2, "refused changes change nothing"
    async with serving() as plain, aiohttp.ClientSession() as http:
        async with http.post(f"{plain.url}/emulator/config", json={"slots": 3}) as r:
            assert r.status in (404, 405)
        assert plain.state.behaviour.slots == 8


def test_settings_from_environment_and_flags() -> None:
    env = {
        "TINCT_EMULATOR_ENGINE": "sglang",
        "TINCT_EMULATOR_TTFT_MS": "250",
        "TINCT_EMULATOR_ACCEPT_VERSIONS": "v1,v2",
    }
    b = from_env(env, ttft_ms=40.0, alt_names=None)
    assert (b.engine, b.ttft_ms, b.accept_versions) == ("sglang", 40.0, ["v1", "v2"])
    assert from_env({"TINCT_EMULATOR_ALT_NAMES": "true"}).alt_names is True
    with pytest.raises(BehaviourError, match=r"throttle_rate.*TINCT_EMULATOR"):
        from_env({"TINCT_EMULATOR_THROTTLE_RATE": "1.5"})
    with pytest.raises(BehaviourError, match="slots"):
        from_env({}, slots=0)


async def test_drift_by_marker_and_by_share_of_prompts(emu: Emulator) -> None:
    emu.set(drift_marker="[cell-b]")
    async with client(emu) as c:

        async def say(prompt: str) -> str:
            r = await c.chat.completions.create(model="m1", messages=[{"role": "user", "content": prompt}])
            return r.choices[0].message.content or ""

        assert (await say("plain question")).startswith("Emulated answer from m1.")
        drifted = await say("a question [cell-b] here")
        assert drifted.startswith("Drifted reply: the candidate")
        assert "Emulated" not in drifted
        emu.set(drift_marker=None, drift_rate=0.3)
        prompts = [f"prompt number {i}" for i in range(200)]
        first = [await say(p) for p in prompts]
        share = sum(a.startswith("Drifted") for a in first) / len(first)
        assert 0.15 < share < 0.45
        # The same prompt drifts every time: it is picked by the prompt, not by chance.
        assert [await say(p) for p in prompts[:40]] == first[:40]


async def test_noise_replaces_a_word_in_its_share_of_sampled_or_deterministic_answers(emu: Emulator) -> None:
    emu.set(noise_rate=0.5)
    async with client(emu) as c:

        async def answers(**kw: object) -> list[str]:
            out = []
            for _ in range(20):
                r = await c.chat.completions.create(model="m1", messages=CHAT, **kw)  # type: ignore[call-overload]
                out.append(r.choices[0].message.content or "")
            return out

        plain = "Emulated answer from m1. Emulated answer"
        sampled = await answers(temperature=0.7)
        assert sum(a != plain for a in sampled) == 10
        assert all(len(a.split()) == len(plain.split()) for a in sampled)
        assert set(await answers(temperature=0)) == {plain}
        assert set(await answers(seed=7)) == {plain}
        emu.set(noise_rate=0.0, noise_rate_deterministic=0.25)
        assert sum(a != plain for a in await answers(temperature=0)) == 5


async def test_json_answers_with_an_added_or_dropped_field_streamed_or_whole(emu: Emulator) -> None:
    async with client(emu) as c:

        async def obj(stream: bool) -> dict[str, object]:
            kw = {"model": "m1", "messages": CHAT, "response_format": {"type": "json_object"}}
            if not stream:
                r = await c.chat.completions.create(**kw)  # type: ignore[call-overload]
                return json.loads(r.choices[0].message.content)  # type: ignore[no-any-return]
            s = await c.chat.completions.create(stream=True, **kw)  # type: ignore[call-overload]
            text = "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
            return json.loads(text)  # type: ignore[no-any-return]

        for stream in (False, True):
            assert set(await obj(stream)) == {"answer", "confidence", "sources"}
        emu.set(json_add_field="citations", json_drop_field="confidence")
        for stream in (False, True):
            assert set(await obj(stream)) == {"answer", "sources", "citations"}


TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("search", "weather", "calendar")
]


async def test_tool_calls_one_per_tool_in_an_order_that_can_change(emu: Emulator) -> None:
    async with client(emu) as c:

        async def calls(stream: bool) -> list[tuple[str, str]]:
            kw = {"model": "m1", "messages": CHAT, "tools": TOOLS}
            if not stream:
                r = await c.chat.completions.create(**kw)  # type: ignore[call-overload]
                assert r.choices[0].finish_reason == "tool_calls"
                assert r.choices[0].message.content is None
                return [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls]
            s = await c.chat.completions.create(stream=True, **kw)  # type: ignore[call-overload]
            got: dict[int, tuple[str, str]] = {}
            finish = None
            async for ch in s:
                for t in ch.choices[0].delta.tool_calls or [] if ch.choices else []:
                    got[t.index] = (t.function.name, t.function.arguments)
                finish = (ch.choices[0].finish_reason if ch.choices else None) or finish
            assert finish == "tool_calls"
            return [got[i] for i in sorted(got)]

        given = await calls(False)
        assert [n for n, _ in given] == ["search", "weather", "calendar"]
        assert {json.loads(a)["limit"] for _, a in given} == {3}
        assert await calls(True) == given
        emu.set(tool_order="reversed")
        assert await calls(False) == given[::-1]
        assert await calls(True) == given[::-1]
        emu.set(tool_order="given", tool_drop=True)
        assert await calls(False) == given[:2]


async def _post(url: str, doc: object) -> tuple[int, object]:
    async with aiohttp.ClientSession() as http, http.post(url, json=doc) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def test_vllm_loads_serves_lists_and_unloads_adapters_at_run_time(
    emu: Emulator, tmp_path: Path
) -> None:
    sql = make_adapter(tmp_path / "sql", r=8, base_model="m1")
    load, unload = f"{emu.url}/v1/load_lora_adapter", f"{emu.url}/v1/unload_lora_adapter"
    status, _ = await _post(load, {"lora_name": "sql", "lora_path": str(sql)})
    assert status == 404, "an engine not started for runtime LoRA has no such endpoint"
    async with client(emu) as c:
        r = await c.chat.completions.create(model="anything", messages=CHAT)
        assert r.model == "m1", "without runtime LoRA every model name is the base's"

    emu.set(runtime_lora=True, max_lora_rank=8, max_loras=2)
    assert (await _post(f"{emu.url}/load_lora_adapter", {"lora_name": "x", "lora_path": str(sql)}))[0] == 404
    status, text = await _post(load, {"lora_name": "sql-3f2a", "lora_path": sql.as_uri()})
    assert (status, text) == (200, "Success: LoRA adapter 'sql-3f2a' added successfully.")
    status, doc = await _post(load, {"lora_name": "sql-3f2a", "lora_path": str(sql)})
    assert status == 400
    assert "already been loaded" in doc["error"]["message"]  # type: ignore[index]

    async with client(emu) as c:
        listed = {m.id: m for m in (await c.models.list()).data}
        assert set(listed) == {"m1", "sql-3f2a"}
        assert listed["sql-3f2a"].parent == "m1"  # type: ignore[attr-defined]
        assert listed["sql-3f2a"].root == sql.as_uri()  # type: ignore[attr-defined]
        assert listed["m1"].parent is None  # type: ignore[attr-defined]
        whole = await c.chat.completions.create(model="sql-3f2a", messages=CHAT)
        assert whole.model == "sql-3f2a"
        assert whole.choices[0].message.content == "Emulated answer from sql-3f2a. Emulated answer"
        stream = await c.chat.completions.create(model="sql-3f2a", messages=CHAT, stream=True)
        chunks = [ch async for ch in stream]
        assert {ch.model for ch in chunks} == {"sql-3f2a"}
        base = await c.chat.completions.create(model="m1", messages=CHAT)
        assert base.choices[0].message.content.startswith("Emulated answer from m1.")  # type: ignore[union-attr]
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await c.chat.completions.create(model="sql-0000", messages=CHAT)
    assert emu.state.adapter_requests == {"sql-3f2a": 2}

    wide = make_adapter(tmp_path / "wide", r=16, base_model="m1")
    status, doc = await _post(load, {"lora_name": "wide", "lora_path": str(wide)})
    assert status == 400
    assert "rank 16 is greater than max_lora_rank 8" in doc["error"]["message"]  # type: ignore[index]
    status, doc = await _post(load, {"lora_name": "gone", "lora_path": str(tmp_path / "nowhere")})
    assert status == 404
    status, _ = await _post(load, {"lora_name": "other", "lora_path": str(make_adapter(tmp_path / "o", r=4))})
    assert status == 200
    status, doc = await _post(load, {"lora_name": "third", "lora_path": str(make_adapter(tmp_path / "t"))})
    assert status == 500
    assert "out of memory" in doc["error"]["message"]  # type: ignore[index]

    status, text = await _post(unload, {"lora_name": "sql-3f2a"})
    assert (status, text) == (200, "Success: LoRA adapter 'sql-3f2a' removed successfully.")
    status, doc = await _post(unload, {"lora_name": "sql-3f2a"})
    assert status == 404
    assert "cannot be found" in doc["error"]["message"]  # type: ignore[index]
    emu.restart()
    assert emu.state.adapters == {}, "a restarted engine holds no adapter"


async def test_sglang_answers_its_own_shapes_and_refuses_adapters_it_lacks(
    emu: Emulator, tmp_path: Path
) -> None:
    emu.set(engine="sglang", runtime_lora=True, max_loras=0)
    adapter = make_adapter(tmp_path / "a", base_model="m1")
    assert (await _post(f"{emu.url}/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapter)}))[
        0
    ] == 404
    load = f"{emu.url}/load_lora_adapter"
    status, doc = await _post(load, {"lora_name": "a", "lora_path": str(adapter)})
    assert status == 400
    assert doc["success"] is False  # type: ignore[index]
    assert "out of memory" in doc["error_message"]  # type: ignore[index]
    emu.set(max_loras=4)
    status, doc = await _post(load, {"lora_name": "a", "lora_path": str(adapter)})
    assert (status, doc) == (
        200,
        {"success": True, "error_message": "", "loaded_adapters": {"a": str(adapter)}},
    )
    async with client(emu) as c:
        assert (await c.chat.completions.create(model="a", messages=CHAT)).model == "a"
        with pytest.raises(openai.BadRequestError, match="not loaded"):
            await c.chat.completions.create(model="b", messages=CHAT)
    status, doc = await _post(f"{emu.url}/unload_lora_adapter", {"lora_name": "a"})
    assert (status, doc["loaded_adapters"]) == (200, {})  # type: ignore[index]


async def test_vllm_exports_the_adapters_running_and_waiting(emu: Emulator, tmp_path: Path) -> None:
    assert not any("lora" in k for k in await metrics(emu)), "no LoRA gauge without LoRA"
    emu.set(runtime_lora=True, slots=1, ttft_ms=300)
    for name in ("a", "b"):
        status, _ = await _post(
            f"{emu.url}/v1/load_lora_adapter",
            {"lora_name": name, "lora_path": str(make_adapter(tmp_path / name, base_model="m1"))},
        )
        assert status == 200

    async def gauge() -> dict[str, str]:
        async with aiohttp.ClientSession() as http, http.get(f"{emu.url}/metrics") as r:
            text = await r.text()
        (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"]
        (sample,) = fam.samples
        assert sample.value > 1e9, "the value is a timestamp, as vLLM's"
        return dict(sample.labels)

    assert await gauge() == {"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    async with client(emu) as c:
        calls = [asyncio.ensure_future(c.chat.completions.create(model=m, messages=CHAT)) for m in ("a", "b")]
        await eventually_async(
            lambda: emu.state.running == 1 and emu.state.waiting == 1,
            timeout=30,
            what="one running, one waiting",
        )
        got = await gauge()
        assert {got["running_lora_adapters"], got["waiting_lora_adapters"]} == {"a", "b"}
        await asyncio.gather(*calls)
    assert await gauge() == {"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": ""}

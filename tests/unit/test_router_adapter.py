"""A LoRA adapter candidate through the router: the served name on the way in, the base name
on the way out, and the base model when a pod lacks the adapter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tinct.api.routing import RoutingTable
from tinct.emulator import Behaviour, Emulator, serving
from tinct.router.adapter import NameBack, model_span, with_model
from tinct_testing.lora_artifacts import make_adapter
from tinct_testing.router_fakes import running_router, table_doc

SERVED = "support-0123456789ab"
CHAT = [{"role": "user", "content": "hi"}]


def test_only_the_top_level_model_value_is_rewritten() -> None:
    body = b'{"messages": [{"role": "user", "content": "\\"model\\": \\"x\\""}], "model" : "llama3" ,"n":1}'
    rewritten, sent = with_model(body, SERVED) or (b"", "")
    assert sent == "llama3"
    assert rewritten == body.replace(b'"llama3"', json.dumps(SERVED).encode())
    assert json.loads(rewritten)["messages"] == json.loads(body)["messages"]
    assert with_model(b'{"model": 3}', SERVED) is None
    assert with_model(b'{"meta": {"model": "a"}}', SERVED) is None
    assert model_span(b'{"model": "a", "model": "b"}') == (24, 27)


def test_answer_names_the_base_model_across_chunk_borders() -> None:
    out: list[bytes] = []
    back = NameBack(SERVED, "llama3", out.append)
    whole = b'data: {"model": "' + SERVED.encode() + b'", "x": 1}\n\n'
    for i in range(0, len(whole), 5):
        back(whole[i : i + 5])
    back.flush()
    assert b"".join(out) == whole.replace(SERVED.encode(), b"llama3")


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[tuple[Emulator, Emulator, Path]]:
    behaviour = {"model": "llama3", "ttft_ms": 0, "itl_ms": 0, "output_tokens": 4, "runtime_lora": True}
    async with (
        serving(Behaviour(**behaviour), control=True) as a,
        serving(Behaviour(**behaviour), control=True) as b,
    ):
        yield a, b, make_adapter(tmp_path / "support", base_model="llama3")


async def _post(url: str, doc: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as http, http.post(url, json=doc) as r:
        return r.status


async def test_adapter_share_goes_to_the_pod_holding_it_under_the_base_name(
    pods: tuple[Emulator, Emulator, Path],
) -> None:
    holding, other, adapter = pods
    assert (
        await _post(f"{holding.url}/v1/load_lora_adapter", {"lora_name": SERVED, "lora_path": str(adapter)})
        == 200
    )
    doc = table_doc(
        other.url, other.url, cells=[{"match": {"role": "admin"}, "weight": 100}], models=["llama3"]
    )
    doc["candidate"].update(adapter=SERVED, addresses=[holding.url])
    async with running_router(RoutingTable.model_validate(doc)) as (base, _):
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="t", max_retries=0)
        admin = {"X-User-Role": "admin"}
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="llama3",
                messages=CHAT,
                extra_headers=admin,  # type: ignore[arg-type]
            )
            chat = raw.parse()
            assert chat.model == "llama3", "the client sees the name it sent"
            assert chat.choices[0].message.content == f"Emulated answer from {SERVED}", "the adapter answered"
            assert "x-fallback-reason" not in raw.headers
            assert holding.state.adapter_requests == {SERVED: 1}
            stream = await client.chat.completions.create(
                model="llama3",
                messages=CHAT,
                stream=True,
                extra_headers=admin,  # type: ignore[arg-type]
            )
            assert {c.model async for c in stream} == {"llama3"}
            assert holding.state.adapter_requests == {SERVED: 2}
            plain = await client.chat.completions.create(model="llama3", messages=CHAT)  # type: ignore[arg-type]
            assert plain.choices[0].message.content == "Emulated answer from llama3"
            assert holding.state.adapter_requests == {SERVED: 2}, "stable's share stays on the base"

            assert await _post(f"{holding.url}/v1/unload_lora_adapter", {"lora_name": SERVED}) == 200
            raw = await client.chat.completions.with_raw_response.create(
                model="llama3",
                messages=CHAT,
                extra_headers=admin,  # type: ignore[arg-type]
            )
            assert raw.headers["x-fallback-reason"] == "adapter_missing"
            assert raw.parse().model == "llama3"
        finally:
            await client.close()

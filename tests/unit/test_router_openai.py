"""The official openai client, pointed at the router, completes chat and streaming requests."""

from __future__ import annotations

import openai
import pytest

from tinct_testing.router_fakes import FakeScheduler, running_router, table


async def test_openai_chat_and_stream_through_the_router(
    backends: tuple[FakeScheduler, FakeScheduler],
) -> None:
    v1, v2 = backends
    cells = [{"match": {"role": "admin"}, "weight": 100}]
    async with running_router(table(v1.url, v2.url, cells=cells)) as (base, _):
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="test", max_retries=0)
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="llama3", messages=[{"role": "user", "content": "hi"}]
            )
            chat = raw.parse()
            assert chat.choices[0].message.content == "hello from v1"
            assert raw.headers["x-scheduler-active"] == "v1"

            stream = await client.chat.completions.create(
                model="llama3",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"X-User-Role": "admin"},
            )
            parts = [
                c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content
            ]
            assert "".join(parts) == "hello from v2"
            assert v2.seen[-1].headers["X-Scheduler-Version"] == "v2"

            done = await client.completions.create(model="llama3", prompt="once upon")
            assert done.choices[0].text == "hello from v1"
        finally:
            await client.close()


async def test_openai_client_sees_a_readable_error_for_a_bad_request(
    backends: tuple[FakeScheduler, FakeScheduler],
) -> None:
    v1, v2 = backends
    async with running_router(table(v1.url, v2.url)) as (base, _):
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="test", max_retries=0)
        try:
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="llama3", messages="not a list")  # type: ignore[arg-type]
            assert "messages" in str(e.value)
        finally:
            await client.close()

"""The comparer over real HTTP: pairs of real emulator answers in, metrics and Delta rows out;
its intake rules; the judge against a small OpenAI-compatible judge server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from tinct.api.routing import RoutingTable
from tinct.emulator import Behaviour
from tinct.emulator import serving as emulating
from tinct.emulator.server import Emulator
from tinct.router.table import TableHolder
from tinct.shadow.service import MAX_LINES, Comparer, ComparerConfig, serving
from tinct_testing.shadow_helpers import TAG, judge_server, mirror, post_pairs
from tinct_testing.shadow_helpers import example_table as table

TOKEN = "s3cret-token"
CHAT = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "what is a dye tag?"}]}


@pytest.fixture
async def engines() -> AsyncIterator[tuple[Emulator, Emulator]]:
    quick = {"model": "m", "ttft_ms": 0, "itl_ms": 0, "output_tokens": 8}
    async with (
        emulating(Behaviour(**quick), control=True) as v1,
        emulating(Behaviour(**quick), control=True) as v2,
    ):
        yield v1, v2


async def _comparer(tmp_path: Path, t: RoutingTable, **kw: Any) -> Any:
    holder = TableHolder()
    holder.put("file test", t)
    config = ComparerConfig(
        host="127.0.0.1", port=0, token=TOKEN, lineage_root=str(tmp_path / "lineage"), batch_seconds=0.1, **kw
    )
    return serving(config, holder=holder)


async def settle(c: Comparer, n: int) -> None:
    """Wait until ``n`` pairs are finished (counted and handed to the recorder)."""
    for _ in range(3000):
        if c.done >= n and not c.judging:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{c.done} of {n} pairs finished")


class Counts:
    """The counters a scrape of the comparer shows."""

    def __init__(self, text: str) -> None:
        self.samples = [
            (s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name.endswith("_total")
        ]

    def __call__(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s series with these labels."""
        return sum(
            v for n, ls, v in self.samples if n == name and all(ls.get(k) == x for k, x in labels.items())
        )


async def counts(http: aiohttp.ClientSession, c: Comparer) -> Counts:
    async with http.get(f"{c.url}/metrics") as r:
        return Counts(await r.text())


def rows(tmp_path: Path, c: Comparer) -> list[dict[str, Any]]:
    return DeltaTable(str(tmp_path / "lineage" / "shadow_pairs")).to_pyarrow_table().to_pylist()


async def test_real_answers_compared_counted_and_recorded_without_text(
    tmp_path: Path, engines: tuple[Emulator, Emulator]
) -> None:
    v1, v2 = engines
    v2.set(drift_marker="[drift]")
    drifted = {**CHAT, "messages": [{"role": "user", "content": "[drift] what is a dye tag?"}]}
    async with await _comparer(tmp_path, table()) as c, aiohttp.ClientSession() as http:
        pairs = [
            await mirror(http, v1.url, v2.url, CHAT),
            await mirror(http, v1.url, v2.url, {**CHAT, "stream": True}),
            await mirror(http, v1.url, v2.url, drifted),
            await mirror(http, v1.url, v2.url, {**drifted, "stream": True}),
            await mirror(http, v1.url, v2.url, CHAT, target="stable"),
        ]
        assert await post_pairs(http, c.url, pairs, TOKEN) == (202, {"accepted": 5, "refused": 0})
        await settle(c, 5)
        m = await counts(http, c)
        pairs_total = "tinct_shadow_pairs_total"
        labels = {"namespace": "llm", "release": "chat", "dye_tag": TAG}
        assert m(pairs_total, target="candidate", verdict="same", **labels) == 2
        assert m(pairs_total, target="candidate", verdict="different", **labels) == 2
        assert m(pairs_total, target="stable", verdict="same", **labels) == 1
        c.recorder.flush()  # type: ignore[union-attr]
        for _ in range(500):
            if m("tinct_shadow_recorded_total") == 5:
                break
            await asyncio.sleep(0.02)
            m = await counts(http, c)
        assert m("tinct_shadow_recorded_total") == 5
    got = sorted(rows(tmp_path, c), key=lambda r: (r["target"], r["verdict"]))
    assert [(r["target"], r["verdict"], r["layer"]) for r in got] == [
        ("candidate", "different", "text"),
        ("candidate", "different", "text"),
        ("candidate", "same", "text"),
        ("candidate", "same", "text"),
        ("stable", "same", "text"),
    ]
    r = got[0]
    assert r["cell"] == "len:short+role:user+latency:low"
    assert (r["stable_model_version"], r["candidate_model_version"]) == ("llama3-8b-1-4-0", "llama3-8b-2-0-0")
    assert r["deterministic"] is True
    assert len(r["prompt_sha256"]) == 64
    assert (r["prompt_text"], r["stable_text"], r["candidate_text"]) == (None, None, None)
    assert r["stable_bytes"] > 0
    assert r["detail"] == "deterministic request, the texts differ"


async def test_keep_text_keeps_it_cut_to_max_text_bytes(
    tmp_path: Path, engines: tuple[Emulator, Emulator]
) -> None:
    v1, v2 = engines
    async with (
        await _comparer(tmp_path, table({"keepText": True, "maxTextBytes": 12})) as c,
        aiohttp.ClientSession() as http,
    ):
        assert (await post_pairs(http, c.url, [await mirror(http, v1.url, v2.url, CHAT)], TOKEN))[0] == 202
        await settle(c, 1)
    (r,) = rows(tmp_path, c)
    assert (r["prompt_text"], r["stable_text"], r["candidate_text"]) == (
        "user: what i",
        "Emulated ans",
        "Emulated ans",
    )


async def test_intake_refuses_what_no_table_names_and_bounds_requests(
    tmp_path: Path, engines: tuple[Emulator, Emulator]
) -> None:
    v1, v2 = engines
    async with await _comparer(tmp_path, table()) as c, aiohttp.ClientSession() as http:
        good = await mirror(http, v1.url, v2.url, CHAT)
        assert (await post_pairs(http, c.url, [good], None))[0] == 401
        assert (await post_pairs(http, c.url, [good], "wrong"))[0] == 401
        bad = [
            {**good, "release": "other"},
            {**good, "namespace": "elsewhere"},
            {**good, "uid": "uid-2"},
            {**good, "dye_tag": "len:huge+role:user+latency:low"},
            {**good, "v": 2},
        ]
        assert await post_pairs(http, c.url, bad, TOKEN) == (202, {"accepted": 0, "refused": 5})
        m = await counts(http, c)
        for reason, n in (("unknown_release", 2), ("uid", 1), ("dye_tag", 1), ("invalid", 1)):
            assert m("tinct_shadow_refused_total", reason=reason) == n
        too_many = [good] * (MAX_LINES + 1)
        assert (await post_pairs(http, c.url, too_many, TOKEN))[0] == 413
        async with http.get(f"{c.url}/readyz") as r:
            assert r.status == 200
    # A table whose cells do not mirror takes no pairs.
    async with await _comparer(tmp_path / "b", table(cell_shadow=0)) as c, aiohttp.ClientSession() as http:
        assert await post_pairs(http, c.url, [good], TOKEN) == (202, {"accepted": 0, "refused": 1})
        assert (await counts(http, c))("tinct_shadow_refused_total", reason="no_shadow") == 1


async def test_a_full_queue_drops_and_counts(tmp_path: Path, engines: tuple[Emulator, Emulator]) -> None:
    v1, v2 = engines
    async with await _comparer(tmp_path, table(), queue_size=2) as c, aiohttp.ClientSession() as http:
        pair = await mirror(http, v1.url, v2.url, CHAT)
        c.executor.submit(lambda: None).result()
        status, answer = await post_pairs(http, c.url, [pair] * 50, TOKEN)
        assert status == 202
        assert answer["accepted"] + answer["refused"] == 50
        assert answer["refused"] >= 45
        assert (await counts(http, c))("tinct_shadow_queue_dropped_total") == answer["refused"]


JUDGE = {"name": "local", "model": "judge-1", "sampleRate": 1.0, "minConfidence": 0.85, "timeoutSeconds": 1}


@pytest.mark.parametrize(
    ("mode", "outcome", "verdict", "layer"),
    [
        ("match", "match", "same", "judge"),
        ("mismatch", "mismatch", "different", "judge"),
        ("first", "inconclusive", "different", "text"),
        ("unsure", "low_confidence", "different", "text"),
        ("slow", "timeout", "different", "text"),
        ("broken", "error", "different", "text"),
        ("prose", "error", "different", "text"),
    ],
)
async def test_judge_outcomes(
    tmp_path: Path, engines: tuple[Emulator, Emulator], mode: str, outcome: str, verdict: str, layer: str
) -> None:
    v1, v2 = engines
    v2.set(drift_rate=1.0)
    async with judge_server(mode) as judge:
        t = table({"judge": JUDGE})
        async with (
            await _comparer(tmp_path, t, judges={"local": judge.url}) as c,
            aiohttp.ClientSession() as http,
        ):
            pairs = [await mirror(http, v1.url, v2.url, CHAT), await mirror(http, v1.url, v1.url, CHAT)]
            assert (await post_pairs(http, c.url, pairs, TOKEN))[1] == {"accepted": 2, "refused": 0}
            await settle(c, 2)
            m = await counts(http, c)
        assert m("tinct_shadow_judge_total", outcome=outcome) == 1
        # Both orders were asked, stable's answer first once.
        assert len(judge.asked) == 2
        assert sum(q.split("Answer A:\n", 1)[1].startswith("Emulated answer") for q in judge.asked) == 1
        assert "what is a dye tag?" in judge.asked[0]
    judged = [r for r in rows(tmp_path, c) if r["judge_outcome"]]
    assert [(r["verdict"], r["layer"], r["judge_outcome"]) for r in judged] == [(verdict, layer, outcome)]


async def test_judge_budget_and_unknown_judge_are_counted_never_waited_for(
    tmp_path: Path, engines: tuple[Emulator, Emulator]
) -> None:
    v1, v2 = engines
    v2.set(drift_rate=1.0)
    async with judge_server("slow") as judge:
        judge.delay = 0.5
        t = table({"judge": {**JUDGE, "timeoutSeconds": 5}})
        async with await _comparer(tmp_path, t, judges={"local": judge.url}, judge_concurrency=1) as c, aiohttp.ClientSession() as http:  # fmt: skip
            pairs = [await mirror(http, v1.url, v2.url, {**CHAT, "seed": i}) for i in range(4)]
            assert (await post_pairs(http, c.url, pairs, TOKEN))[1]["accepted"] == 4
            await settle(c, 4)
            m = await counts(http, c)
        assert m("tinct_shadow_judge_total", outcome="budget") == 3
        assert m("tinct_shadow_judge_total", outcome="mismatch") == 1
    t = table({"judge": {**JUDGE, "name": "nowhere"}})
    async with await _comparer(tmp_path / "b", t) as c, aiohttp.ClientSession() as http:
        assert (await post_pairs(http, c.url, [await mirror(http, v1.url, v2.url, CHAT)], TOKEN))[0] == 202
        await settle(c, 1)
        assert (await counts(http, c))("tinct_shadow_judge_total", outcome="error") == 1


TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("search", "weather", "calendar")
]
JSON_CHAT = {**CHAT, "response_format": {"type": "json_object"}}


@pytest.mark.parametrize("stream", [False, True])
async def test_real_json_and_tool_call_answers(
    tmp_path: Path, engines: tuple[Emulator, Emulator], stream: bool
) -> None:
    v1, v2 = engines
    tools = {**CHAT, "tools": TOOLS, "stream": stream}
    as_json = {**JSON_CHAT, "stream": stream}
    async with await _comparer(tmp_path, table()) as c, aiohttp.ClientSession() as http:

        async def verdict(request: dict[str, Any], **behaviour: Any) -> tuple[str, str | None]:
            v2.set(
                **{
                    "json_add_field": None,
                    "json_drop_field": None,
                    "tool_order": "given",
                    "tool_drop": False,
                    **behaviour,
                }
            )
            before = c.done
            assert (await post_pairs(http, c.url, [await mirror(http, v1.url, v2.url, request)], TOKEN))[
                0
            ] == 202
            await settle(c, before + 1)
            assert c.recorder is not None
            c.recorder.flush()
            for _ in range(500):
                got = [r for r in rows(tmp_path, c) if r["recorded_at"] is not None]
                if len(got) == before + 1:
                    last = max(got, key=lambda r: r["recorded_at"])
                    return last["verdict"], last["layer"]
                await asyncio.sleep(0.02)
            raise AssertionError("the pair was not recorded")

        assert await verdict(as_json) == ("same", "text")
        assert await verdict(as_json, json_add_field="citations") == ("same", "text")
        assert await verdict(as_json, json_drop_field="confidence") == ("different", "structure")
        assert await verdict(tools) == ("same", "tools")
        assert await verdict(tools, tool_order="reversed") == ("same", "tools")
        assert await verdict(tools, tool_drop=True) == ("different", "tools")

"""Shadow gate with the real operator, Prometheus, comparer and emulated engines.

Pairs are mirrored from the emulators and POSTed to `tinct comparer --watch` as routers do;
Prometheus scrapes the comparer; the operator judges each window on `shadow-agreement`. A
dark step (weight 0, a shadow share) advances when the candidate answers like stable, rolls
back naming the cell when it does not, and a noise floor keeps a noisy candidate from failing
for the noise stable has too. Last, the whole path: the real router mirrors real `openai`
requests to the candidate and posts the pairs to the comparer, and no client ever gets the
candidate's answer.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from tinct.lineage.sql import query
from tinct_testing import release_stack
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.paths import ROOT
from tinct_testing.release_cluster import (
    apply,
    backends,
    example,
    get,
    history,
    operator,
    table,
    wait_history_written,
)
from tinct_testing.release_traffic import router
from tinct_testing.shadow_helpers import Comparer, Mirrored, PairPump, comparer
from tinct_testing.wait import eventually

SHADOW_DOC = ROOT / "docs" / "concepts" / "shadow-traffic.md"

LONG = "len:long+role:admin+latency:high"
DEFAULT = "len:*+role:*+latency:*"
#: The dye tags the pairs carry: one in the long/admin/high cell, one in the default cell.
LONG_TAG = "len:long+role:admin+latency:high"
OTHER_TAG = "len:medium+role:audit+latency:low"
DARK = [
    {
        "match": {"promptLength": "long", "role": "admin", "latency": "high"},
        "weights": [0, 100],
        "shadow": [20, 0],
    },
    {"match": {}, "weights": [0, 100], "shadow": [20, 0]},
]


@dataclass
class Stack(release_stack.Stack):
    """The release stack with a comparer beside the router, Prometheus scraping both."""

    comparer: Comparer

    def release(
        self, minimum: float = 90, interval: str = "4s", min_pairs: int = 10, **kw: Any
    ) -> dict[str, Any]:
        analysis = {
            "interval": interval,
            "failureLimit": 1,
            "inconclusiveLimit": 50,
            "prometheus": {"url": self.prometheus.url},
            "metrics": [{"name": "shadow-agreement", "min": minimum, "minPairs": min_pairs}],
        }
        doc = example(analysis=analysis, cells=DARK, **kw)
        doc["spec"]["stable"]["url"] = self.engines.v1.url
        doc["spec"]["candidate"]["url"] = self.engines.v2.url
        return doc

    def uid(self) -> str | None:
        obj = get(self.cluster, self.ns, "grayrelease", "chat")
        return None if obj is None else str(obj["metadata"]["uid"])

    def pump(self, long_prompt: str = "a long question", **kw: Any) -> PairPump:
        cells = [Mirrored(LONG_TAG, long_prompt), Mirrored(OTHER_TAG, "another question")]
        return PairPump(
            self.comparer, self.engines.v1.url, self.engines.v2.url, cells, self.uid, self.ns, **kw
        )


@pytest.fixture
def stack(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> Iterator[Stack]:
    # One model name: the answers differ only where told to.
    with (
        release_stack.Stack.running(cluster, namespace, tmp_path, prometheus, names=("m", "m")) as base,
        comparer(namespace, tmp_path / "comparer.log", tmp_path / "lineage") as c,
    ):
        # The router confirms each table (the analysis window starts there); the comparer
        # exports the pairs' verdicts.
        base.prometheus.set_targets([f"127.0.0.1:{base.router.port}", f"127.0.0.1:{c.port}"])
        yield Stack(**vars(base), comparer=c)


def _phase(stack: Stack, *phases: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        st = stack.status()
        return st if st.get("phase") in phases else None

    return check


def _explain(stack: Stack, pump: PairPump) -> Callable[[], str]:
    """What a wait for a phase shows when it gives up: the release's status (its last
    analysis says why it held) and how many pairs the comparer took."""

    def explain() -> str:
        st = json.dumps(stack.status(), indent=1)
        return f"pairs accepted {pump.accepted}, refused {pump.refused}; status:\n{st}"

    return explain


def test_a_dark_step_whose_candidate_answers_alike_advances(stack: Stack) -> None:
    with operator(stack.ns, stack.root, TINCT_PROMETHEUS_URL=stack.prometheus.url):
        apply(stack.cluster, stack.ns, stack.release())
        with stack.pump() as pump:
            # The dark step mirrors 20 % of both cells; the candidate serves no one.
            def mirroring() -> tuple[int, dict[str, Any]] | None:
                got = table(stack.cluster, stack.ns)
                return got if got is not None and got[1].get("shadow") else None

            dark = eventually(mirroring, timeout=60, what="the dark step's table")
            assert [(c["weight"], c["shadow"]) for c in dark[1]["cells"]] == [(0, 20), (0, 20)]
            assert dark[1]["shadow"]["candidateModelVersion"] == "llama3-8b-2-0-0"
            st = eventually(
                _phase(stack, "Promoted", "RolledBack"),
                timeout=240,
                what="Promoted",
                explain=_explain(stack, pump),
            )
        wait_history_written(stack.cluster, stack.ns)
    assert st["phase"] == "Promoted", st.get("message")
    assert pump.accepted > 0
    rows = history(stack.root)
    advanced = next(
        r for r in rows if r["reason"].startswith("StepAdvanced") or r["reason"].startswith("Promoted")
    )
    assert "shadow-agreement 100" in advanced["reason"]
    # The pairs are rows of shadow_pairs: the docs' query says how each cell agreed.
    (sql,) = re.findall(r'^tinct lineage sql "(.*FROM shadow_pairs.*)"$', SHADOW_DOC.read_text(), re.M)
    by_cell = query(sql, str(stack.root)).to_pylist()
    assert {r["cell"]: r["agree_pct"] for r in by_cell} == {LONG: 100.0, DEFAULT: 100.0}
    assert all(r["pairs"] > 0 and r["judged"] == 0 and r["since"] is not None for r in by_cell)


def test_a_candidate_that_drifts_in_one_cell_is_rolled_back_at_the_dark_step_naming_it(stack: Stack) -> None:
    stack.engines.set(stack.engines.v2, drift_marker="[legal]")
    with operator(stack.ns, stack.root, TINCT_PROMETHEUS_URL=stack.prometheus.url):
        apply(stack.cluster, stack.ns, stack.release())
        with stack.pump(long_prompt="[legal] may I quote this contract?") as pump:
            st = eventually(
                _phase(stack, "RolledBack", "Promoted"),
                timeout=240,
                what="RolledBack",
                explain=_explain(stack, pump),
            )
        wait_history_written(stack.cluster, stack.ns)
    assert st["phase"] == "RolledBack"
    assert f"cell {LONG} agrees 0%" in st["message"]
    shadow = st["lastAnalysis"]["shadow"]
    assert shadow["worstCell"] == LONG
    cells = {c["cell"]: c for c in shadow["cells"]}
    # The cell fails on its own once it has minPairs; on a slow machine the release's pairs
    # may fail the gate first, and the message names the cell all the same.
    assert cells[LONG]["verdict"] in ("Fail", "Inconclusive")
    assert cells[LONG]["adjusted"] == 0
    assert cells[DEFAULT]["adjusted"] == 100
    # The candidate never had live traffic: every recorded transition kept its weights at 0.
    assert all(set(dict(r["weights"]).values()) == {0.0} for r in history(stack.root))
    warned = stack.cluster.kubectl("get", "events", "-n", stack.ns, "-o", "json").stdout
    assert any(e["reason"] == "RolledBack" and LONG in e["message"] for e in json.loads(warned)["items"])


def test_a_noisy_stable_does_not_fail_an_equally_noisy_candidate(stack: Stack) -> None:
    # Temperature 0, yet a third of the answers of each engine differ (batch nondeterminism).
    for engine in (stack.engines.v1, stack.engines.v2):
        stack.engines.set(engine, noise_rate_deterministic=0.35)
    with operator(stack.ns, stack.root, TINCT_PROMETHEUS_URL=stack.prometheus.url):
        # Each engine alone agrees with itself ~42 % of the time: judged on a handful of pairs,
        # the two estimates (the candidate's and the floor) differ by 25 pp either way, so the
        # windows are long enough for 30 pairs and the bar sits well below what noise moves.
        apply(stack.cluster, stack.ns, stack.release(minimum=60, interval="10s", min_pairs=30))
        with stack.pump(noise_every=3) as pump:
            st = eventually(
                _phase(stack, "Promoted", "RolledBack"),
                timeout=240,
                what="Promoted",
                explain=_explain(stack, pump),
            )
    assert st["phase"] == "Promoted", st.get("message")
    rows = query(
        "SELECT target, verdict, count(*) AS n FROM shadow_pairs GROUP BY target, verdict", str(stack.root)
    ).to_pylist()
    counts = {(r["target"], r["verdict"]): r["n"] for r in rows}
    raw = counts.get(("candidate", "same"), 0) / sum(n for (t, _), n in counts.items() if t == "candidate")
    assert raw < 0.6, "without the noise floor the candidate would have failed"
    assert counts.get(("stable", "different"), 0) > 0


@dataclass
class Client:
    """The official ``openai`` client through the router, as a caller of one dye cell."""

    port: int
    role: str
    latency: str
    prompt: str
    stream: bool
    answers: list[tuple[str, str]] = field(default_factory=list)  # (X-Scheduler-Active, content)

    def ask(self) -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)
        headers = {"X-User-Role": self.role, "X-Latency-Class": self.latency}
        messages: Any = [{"role": "user", "content": self.prompt}]
        raw = client.chat.completions.with_raw_response.create(
            model="llama3-8b", messages=messages, temperature=0, stream=self.stream, extra_headers=headers
        )
        side = raw.headers.get("x-scheduler-active", "?")
        if self.stream:
            text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
        else:
            text = raw.parse().choices[0].message.content or ""
        self.answers.append((side, text))


@pytest.mark.parametrize("drifts", [True, False], ids=["drifting", "alike"])
def test_routers_mirror_openai_traffic_to_the_comparer_and_the_gate_decides(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus], drifts: bool
) -> None:
    """The real router mirrors the dark step's shadow share of real `openai` requests
    (streamed and not) to the candidate and posts the pairs to the real comparer. A candidate
    that drifts in the long cell is rolled back naming that cell, and every client got
    stable's answer, never the candidate's; one that answers alike is promoted, and no client
    got the candidate's answer before the table gave it live weight."""
    backends(cluster, namespace, tmp_path)
    engines = Engines(names=("llama3-8b", "llama3-8b"))
    if drifts:
        engines.set(engines.v2, drift_marker="[legal]")
    token = tmp_path / "comparer-token"
    token.write_text("test-token")
    long_prompt = "[legal] may I quote this contract? " + "tell me about dye tags " * 1200
    clients = [
        Client(0, "admin", "high", long_prompt, stream=False),
        Client(0, "admin", "high", long_prompt, stream=True),
        Client(0, "audit", "low", "another question", stream=True),
        Client(0, "audit", "low", "another question", stream=False),
    ]
    try:
        with (
            comparer(namespace, tmp_path / "comparer.log", tmp_path / "lineage", token="test-token") as c,
            router(
                namespace,
                tmp_path / "router.log",
                extra=["--comparer", c.url, "--comparer-token-file", str(token)],
            ) as r,
        ):
            prom = prometheus()
            prom.set_targets([f"127.0.0.1:{r.port}", f"127.0.0.1:{c.port}"])
            stack = Stack(cluster, namespace, tmp_path / "lineage", engines, r, prom, comparer=c)
            stop = threading.Event()

            def traffic(client: Client) -> None:
                client.port = r.port
                while not stop.is_set():
                    try:
                        client.ask()
                    except openai.OpenAIError as exc:  # counted against the invariant below
                        client.answers.append(("error", repr(exc)))

            with operator(namespace, stack.root, TINCT_PROMETHEUS_URL=prom.url):
                # Windows long enough for a loaded machine's few long-prompt requests a second
                # to bring minPairs pairs each: a window short of them is only inconclusive.
                apply(cluster, namespace, stack.release(interval="10s", min_pairs=5))

                def dark_step() -> int | None:  # the table the routers serve, mirroring
                    got = table(cluster, namespace)
                    return got[0] if got is not None and got[1].get("shadow") else None

                dark = eventually(dark_step, timeout=60, what="the dark step's table")
                eventually(
                    lambda: (r.table_version() or -1) >= dark, timeout=30, what="the router serving it"
                )
                threads = [threading.Thread(target=traffic, args=(cl,), daemon=True) for cl in clients]
                for t in threads:
                    t.start()
                try:
                    st = eventually(
                        _phase(stack, "RolledBack", "Promoted"),
                        timeout=480,
                        what="RolledBack or Promoted",
                        explain=lambda: json.dumps(stack.status(), indent=1)[-3000:],
                    )
                finally:
                    stop.set()
                    for t in threads:
                        t.join(60)
                wait_history_written(cluster, namespace)
            mirrored = r.metrics()
        direct: dict[str, str | None] = {}
        for name, engine in (("v1", engines.v1), ("v2", engines.v2)):
            answer = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="none", max_retries=0)
            direct[name] = (
                answer.chat.completions.create(
                    model="llama3-8b", messages=[{"role": "user", "content": long_prompt}], temperature=0
                )
                .choices[0]
                .message.content
            )
    finally:
        engines.stop()
    rows = query(
        "SELECT dye_tag, target, verdict, count(*) AS n FROM shadow_pairs GROUP BY dye_tag, target, verdict",
        str(tmp_path / "lineage"),
    ).to_pylist()
    seen = {(row["dye_tag"], row["target"], row["verdict"]) for row in rows}
    # The pairs came from the router: its counters and the comparer's rows say so.
    for family in ("tinct_router_shadow_mirrors_total", "tinct_router_shadow_pairs_sent_total"):
        assert re.search(rf"^{family}\{{.*\}} [1-9]", mirrored, re.M), mirrored[-3000:]
    assert any(tag != LONG_TAG and verdict == "same" for tag, _, verdict in seen), rows
    for client in clients:
        assert client.answers, client
        assert not [a for a in client.answers if a[0] == "error"], client.answers
    if not drifts:
        assert st["phase"] == "Promoted", st.get("message")
        assert (LONG_TAG, "candidate", "different") not in seen, rows
        for client in clients:  # stable's until the table gave the candidate all, then v2's
            sides = [side for side, _ in client.answers]
            assert sides[0] == "v1", sides
            assert sides == sorted(sides), sides
        return
    assert st["phase"] == "RolledBack", st.get("message")
    assert f"cell {LONG} agrees 0%" in st["message"]
    assert (LONG_TAG, "candidate", "different") in seen, rows
    # Every client was answered by stable, with stable's words, streamed or not ...
    for client in clients:
        assert {side for side, _ in client.answers} == {"v1"}, client.answers[-3:]
        assert len({text for _, text in client.answers}) == 1, client.answers[-3:]
    # ... and those words are stable's, not the drifting candidate's.
    assert clients[0].answers[0][1] == direct["v1"] != direct["v2"]

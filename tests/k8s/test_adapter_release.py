"""A LoRA adapter gray-released on stable's own pods, on the real API server.

Stable's pods are Pod objects the stable Service selects, each standing for an emulated engine
(:mod:`tinct_testing.adapter_pods`). The operator loads the adapter into each
through the engine's API, steps the release with no second Deployment, and unloads it after a
rollback.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from tinct.lineage.sql import query
from tinct_testing.adapter_pods import adapter_pods, adapter_release
from tinct_testing.commands import tinct_ok
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lora_artifacts import adapter_artifacts, make_adapter, make_base
from tinct_testing.modelversion_cluster import mv_doc, wait_phase
from tinct_testing.release_cluster import (
    NO_METRICS,
    apply,
    condition,
    history,
    operator,
    release_status,
    service,
    table,
    wait_history_written,
)
from tinct_testing.release_traffic import router
from tinct_testing.wait import WAIT, eventually

#: The adapter's rank; an engine started with a smaller --max-lora-rank refuses it.
RANK = 8


def _versions(cluster: Cluster, ns: str, tmp: Path) -> str:
    """The base ModelVersion and a LoRA adapter of it, both Ready; the adapter's served name."""
    base = make_base(tmp / "base" / "model.safetensors")
    adapter = make_adapter(tmp / "support", r=RANK)
    apply(cluster, ns, mv_doc("base", [{"format": "safetensors", "uri": base.as_uri()}], runtime="vllm"))
    apply(
        cluster,
        ns,
        mv_doc(
            "support-1-0-0", adapter_artifacts(adapter), model="support", adapter={"baseModelVersion": "base"}
        ),
    )
    ready = wait_phase(cluster, ns, "support-1-0-0", "Ready", "Failed")
    assert ready["status"]["phase"] == "Ready", ready["status"]
    served: str = ready["status"]["adapter"]["servedName"]
    return served


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_loads_on_every_pod_steps_and_promotes(
    cluster: Cluster, namespace: str, tmp_path: Path, engine: str
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    with operator(ns, root, TINCT_ALLOW_BACKENDS="127.0.0.0/8"):
        served = _versions(cluster, ns, tmp_path)
        with adapter_pods(cluster.kubeconfig, ns, [engine] * 3) as pods:
            apply(cluster, ns, service("sched", target=pods.port))
            apply(cluster, ns, adapter_release(pods.port, engine, NO_METRICS))
            seen: list[tuple[int, list[str], list[float]]] = []

            def promoted() -> bool:
                st = release_status(cluster, ns)
                got = table(cluster, ns)
                if got is not None:
                    entry = (
                        got[0],
                        got[1]["candidate"].get("addresses", []),
                        [c["weight"] for c in got[1]["cells"]],
                    )
                    if not seen or seen[-1] != entry:
                        seen.append(entry)
                recorded = (st.get("routing") or {}).get("version")
                return st.get("phase") == "Promoted" and got is not None and got[0] == recorded

            eventually(promoted, timeout=WAIT, what="Promoted")
            st = release_status(cluster, ns)
            held = {name: pods.adapters(name) for name in pods.engines}
            shown = tinct_ok("release", "status", "chat", "-n", ns).stdout
            _, doc = table(cluster, ns) or (0, {})
    assert held == {name: {served} for name in ("sched-0", "sched-1", "sched-2")}, "loaded into every pod"
    assert st["adapter"]["servedName"] == served
    assert (st["adapter"]["loaded"], st["adapter"]["total"]) == (3, 3)
    assert st["adapter"]["addresses"] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = doc["stable"]["url"].rsplit(":", 1)[1]
    assert doc["candidate"]["adapter"] == served
    assert doc["candidate"]["addresses"] == [f"http://127.0.0.{i}:{port}" for i in (2, 3, 4)]
    assert [w for _, _, w in seen if w != [0.0]][:1] == [[10.0]], "no candidate traffic before the adapter"
    assert all(addrs for _, addrs, w in seen if any(w)), "candidate traffic only to pods holding it"
    assert f"adapter {served} loaded on 3/3 pods" in shown
    reasons = [r["reason"].split(":")[0] for r in history(root)]
    assert "AdapterLoaded" in reasons
    assert reasons[-1] == "Promoted" or "Promoted" in reasons


def test_refused_load_holds_at_weight_zero_then_rollback_unloads(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    with operator(ns, root, TINCT_ALLOW_BACKENDS="127.0.0.0/8"):
        served = _versions(cluster, ns, tmp_path)
        with adapter_pods(cluster.kubeconfig, ns, ["vllm", "vllm"]) as pods:
            pods.set("sched-1", max_lora_rank=RANK // 2)
            apply(cluster, ns, service("sched", target=pods.port))
            apply(cluster, ns, adapter_release(pods.port, analysis={"interval": "1h", "metrics": []}))

            def refused() -> dict[str, Any] | None:
                got = release_status(cluster, ns)
                reasons = {c.get("reason") for c in got.get("conditions", [])}
                return got if "AdapterLoadFailed" in reasons else None

            st = eventually(refused, timeout=WAIT, what="AdapterLoadFailed")
            cond = condition(st, "BackendsAvailable")
            assert cond["status"] == "False"
            assert "sched-1" in cond["message"]
            assert "max_lora_rank" in cond["message"]
            got = table(cluster, ns)
            assert got is not None
            assert {c["weight"] for c in got[1]["cells"]} == {0}, "no candidate traffic while a load fails"
            assert got[1]["candidate"]["addresses"] == [f"http://127.0.0.2:{pods.port}"]
            assert pods.adapters("sched-1") == set()

            # The engine is given room: the next round loads it, and the release starts.
            pods.set("sched-1", max_lora_rank=RANK)
            eventually(
                lambda: (
                    release_status(cluster, ns).get("phase") == "Progressing"
                    and (release_status(cluster, ns).get("adapter") or {}).get("loaded") == 2
                ),
                timeout=WAIT,
                what="loaded on both pods, Progressing",
            )
            assert pods.adapters("sched-1") == {served}
            tinct_ok("release", "abort", "chat", "-n", ns)
            eventually(
                lambda: release_status(cluster, ns).get("phase") == "RolledBack",
                timeout=WAIT,
                what="RolledBack",
            )
            rolled = table(cluster, ns)
            assert rolled is not None
            assert {c["weight"] for c in rolled[1]["cells"]} == {0}
            eventually(
                lambda: all(not pods.adapters(n) for n in pods.engines),
                timeout=WAIT + 40,
                what="the adapter unloaded from every pod after the drain",
            )
            st = release_status(cluster, ns)
    assert st["adapter"]["withdrawnAt"]
    assert st["adapter"]["loaded"] == 0


@dataclass
class Asker:
    """The official ``openai`` client through the router, asking for the base model."""

    port: int
    stream: bool
    got: list[tuple[str, str, str]] = field(default_factory=list)  # (model named, content, fallback)

    def ask(self) -> None:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)
        messages: Any = [{"role": "user", "content": "which plan suits a team of five?"}]
        raw = api.chat.completions.with_raw_response.create(
            model="llama3-8b", messages=messages, stream=self.stream, max_tokens=4
        )
        reason = raw.headers.get("x-fallback-reason", "-")
        if self.stream:
            chunks = list(raw.parse())
            names = {c.model for c in chunks}
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            self.got.append((",".join(sorted(names)), text, reason))
        else:
            done = raw.parse()
            self.got.append((done.model, done.choices[0].message.content or "", reason))


def test_openai_clients_see_the_base_name_while_a_pod_restarts_and_one_is_added(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Real routers, the official client: an adapter release serves half its requests by the
    adapter under the base name. A pod whose engine restarts (the adapter gone) costs no client
    an error and gets the adapter again; a pod added mid-release is in no table before its
    engine holds the adapter; after the promote every answer is the adapter's, recorded in
    lineage as what the release promoted."""
    ns, root = namespace, tmp_path / "lineage"
    with operator(ns, root, TINCT_ALLOW_BACKENDS="127.0.0.0/8"):
        served = _versions(cluster, ns, tmp_path)
        with (
            adapter_pods(cluster.kubeconfig, ns, ["vllm", "vllm"]) as pods,
            router(ns, tmp_path / "router.log", extra=["--allow-backend", "127.0.0.0/8"]) as r,
        ):
            apply(cluster, ns, service("sched", target=pods.port))
            doc = adapter_release(pods.port, analysis={"interval": "1h", "metrics": []})
            # The restarted pod's misses fall back one by one and never eject the adapter, so the
            # answers after the promote are all the adapter's however slow the reload.
            doc["spec"]["fallback"] = {"consecutiveFailures": 1000}
            apply(cluster, ns, doc)
            # Every table written, with the addresses whose engines held the adapter when read.
            listed: list[tuple[int, list[str], set[str]]] = []
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    got = table(cluster, ns)
                    if got is not None and (not listed or listed[-1][0] != got[0]):
                        hosts = [
                            a.split("//")[1].rsplit(":", 1)[0]
                            for a in got[1]["candidate"].get("addresses", [])
                        ]
                        listed.append((got[0], hosts, pods.holding(served)))
                    stop.wait(0.1)

            def first_step() -> int | None:
                got = table(cluster, ns)
                return got[0] if got is not None and got[1]["cells"][0]["weight"] > 0 else None

            version = eventually(first_step, timeout=WAIT, what="the first step's table")
            eventually(lambda: (r.table_version() or -1) >= version, timeout=30, what="the router serving it")
            askers = [Asker(r.port, stream=False), Asker(r.port, stream=True)]

            def traffic(a: Asker) -> None:
                while not stop.is_set():
                    try:
                        a.ask()
                    except openai.OpenAIError as exc:
                        a.got.append(("error", repr(exc), "-"))

            threads = [threading.Thread(target=watch, daemon=True)]
            threads += [threading.Thread(target=traffic, args=(a,), daemon=True) for a in askers]
            for t in threads:
                t.start()
            try:
                eventually(lambda: all(len(a.got) >= 5 for a in askers), timeout=WAIT, what="answers")
                pods.restart("sched-1")
                eventually(lambda: pods.adapters("sched-1") == {served}, timeout=WAIT, what="reloaded")
                added = pods.add("vllm")
                eventually(
                    lambda: listed and pods.addresses[added] in listed[-1][1],
                    timeout=WAIT,
                    what=f"{added} in the table",
                )
                tinct_ok("release", "promote", "chat", "-n", ns)
                st = eventually(
                    lambda: (s := release_status(cluster, ns)).get("phase") == "Promoted" and s,
                    timeout=WAIT,
                    what="Promoted",
                )
                final = int((st.get("routing") or {}).get("version") or 0)
                eventually(
                    lambda: (r.table_version() or -1) >= final, timeout=30, what="the router serving it"
                )
                after = [len(a.got) for a in askers]
                eventually(
                    lambda: all(len(a.got) >= n + 3 for a, n in zip(askers, after, strict=True)),
                    timeout=WAIT,
                    what="answers after the promote",
                )
            finally:
                stop.set()
                for t in threads:
                    t.join(60)
            held = {name: pods.adapters(name) for name in pods.engines}
            wait_history_written(cluster, ns)
    for a, n in zip(askers, after, strict=True):
        assert not [g for g in a.got if g[0] == "error"], a.got
        assert {name for name, _, _ in a.got} == {"llama3-8b"}, "the client only ever hears the base name"
        assert any(served in text for _, text, _ in a.got), "some answers are the adapter's"
        assert any(served not in text for _, text, _ in a.got), "some answers are the base model's"
        assert all(served in text for _, text, _ in a.got[n + 1 :]), "after the promote, all the adapter's"
    assert held == {name: {served} for name in pods.engines}, "promoted: it stays loaded everywhere"
    added_at = pods.addresses[added]
    assert all(added_at in holding for _, hosts, holding in listed if added_at in hosts), listed
    rows = query(
        "SELECT e.state, e.to_model_version, a.served_name, a.base_model_version FROM release_events e "
        "JOIN adapters a ON a.name = e.to_model_version AND a.namespace = e.namespace "
        f"WHERE e.release = 'chat' AND e.namespace = '{ns}' AND e.state = 'Promoted'",
        str(root),
    ).to_pylist()
    promoted = {(x["to_model_version"], x["served_name"], x["base_model_version"]) for x in rows}
    assert promoted == {("support-1-0-0", served, "base")}, rows

"""A LoRA adapter gray-released on stable's own pods, on the real API server.

Stable's pods are Pod objects the stable Service selects, each standing for an emulated engine
(vLLM or SGLang, runtime LoRA loading on) listening on its own loopback address; their
``status.podIP`` is written through the status subresource (the API server refuses loopback
addresses in EndpointSlices, not in a Pod's status). The operator loads the adapter into each
through the engine's API, steps the release with no second Deployment, and unloads it after a
rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from tinct.emulator import Behaviour, Emulator, serving
from tinct_testing.commands import tinct_ok
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lora_artifacts import adapter_artifacts, make_adapter, make_base
from tinct_testing.modelversion_cluster import mv_doc, wait_phase
from tinct_testing.release_cluster import apply, condition, history, operator, release_status, service, table
from tinct_testing.wait import WAIT, eventually

pytestmark = pytest.mark.usefixtures("crds")

STEPPING = {"interval": "2s", "metrics": []}
#: The adapter's rank; an engine started with a smaller --max-lora-rank refuses it.
RANK = 8


class Pods:
    """Emulated engines on 127.0.0.2, .3, ... (one port for all), each a Pod of Service ``sched``."""

    def __init__(self, cluster: Cluster, ns: str, engines: list[str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="pods")
        self.thread.start()
        self._stack = contextlib.AsyncExitStack()
        self.port = _free_port_on([f"127.0.0.{i + 2}" for i in range(len(engines))])
        self.engines: dict[str, Emulator] = {}
        self.api = kube_client.CoreV1Api(
            kube_config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        )
        self.ns = ns
        for i, engine in enumerate(engines):
            self.add(f"sched-{i}", f"127.0.0.{i + 2}", engine)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def add(self, name: str, address: str, engine: str, **behaviour: Any) -> None:
        """Serve an engine on ``address`` and publish it as a Ready Pod of the stable Service."""
        settings = {
            "model": "llama3-8b",
            "engine": engine,
            "runtime_lora": True,
            "ttft_ms": 0,
            "itl_ms": 0,
            "output_tokens": 4,
            **behaviour,
        }
        emu = self._run(self._stack.enter_async_context(serving(Behaviour(**settings), address, self.port)))
        self.engines[name] = emu
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "sched"}},
            # A node nothing manages: the Pod's status is this test's to write.
            "spec": {
                "nodeName": "nowhere",
                "containers": [{"name": "engine", "image": "registry.invalid/e:1"}],
            },
        }
        self.api.create_namespaced_pod(self.ns, pod)
        status = {
            "status": {
                "phase": "Running",
                "podIP": address,
                "podIPs": [{"ip": address}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        self.api.patch_namespaced_pod_status(name, self.ns, status)

    def set(self, name: str, **changes: Any) -> None:
        emu = self.engines[name]

        async def change() -> None:
            emu.set(**changes)

        self._run(change())

    def adapters(self, name: str) -> set[str]:
        """The adapters the engine of pod ``name`` holds."""
        return set(self.engines[name].state.adapters)

    def close(self) -> None:
        self._run(self._stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _free_port_on(addresses: list[str]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = int(s.getsockname()[1])
        try:
            for a in addresses[1:]:
                with socket.socket() as t:
                    t.bind((a, port))
        except OSError:
            continue
        return port
    raise AssertionError("no port free on every address")


@contextlib.contextmanager
def _pods(cluster: Cluster, ns: str, engines: list[str]) -> Iterator[Pods]:
    pods = Pods(cluster, ns, engines)
    try:
        yield pods
    finally:
        pods.close()


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


def _release(port: int, engine: str = "vllm", analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "GrayRelease",
        "metadata": {"name": "chat"},
        "spec": {
            "stable": {
                "modelVersion": "base",
                "service": "sched",
                "port": 8000,
                "schedulerVersion": "v1",
                "engine": engine,
                "url": f"http://127.0.0.2:{port}",
            },
            "candidate": {"adapter": {"modelVersion": "support-1-0-0"}},
            "dye": {"promptLength": {"buckets": [{"name": "all"}]}},
            "cells": [{"match": {}, "weights": [10, 50]}],
            "analysis": analysis or STEPPING,
        },
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_loads_on_every_pod_steps_and_promotes(
    cluster: Cluster, namespace: str, tmp_path: Path, engine: str
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    with operator(ns, root, TINCT_ALLOW_BACKENDS="127.0.0.0/8"):
        served = _versions(cluster, ns, tmp_path)
        with _pods(cluster, ns, [engine] * 3) as pods:
            apply(cluster, ns, service("sched", target=pods.port))
            apply(cluster, ns, _release(pods.port, engine))
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
        with _pods(cluster, ns, ["vllm", "vllm"]) as pods:
            pods.set("sched-1", max_lora_rank=RANK // 2)
            apply(cluster, ns, service("sched", target=pods.port))
            apply(cluster, ns, _release(pods.port, analysis={"interval": "1h", "metrics": []}))

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

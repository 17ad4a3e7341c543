"""The adapter part of ``bench/release.py``: a LoRA adapter released on emulated vLLM pods.

:func:`measure_adapter` applies a base ModelVersion, ``pods`` emulated engines as Pods of
stable's Service (:mod:`tinct_testing.adapter_pods`), then an adapter ModelVersion and a
GrayRelease of it at once, with the operator and a router running as processes, and measures:

- ``adapter_ready_s``: from the adapter's ModelVersion applied to the router serving the
  first step's table (the adapter loaded on every pod, candidate weight above 0);
- ``adapter_plain_p99_ms``: requests through the router answered by the adapter on pods that
  hold it (the step gives the candidate every request);
- ``adapter_fallback_p99_ms``: the same requests once every engine lost the adapter (restarted,
  the operator stopped so nothing reloads it): each goes to a pod, is refused for the unknown
  model and is answered by the base model in the same request (``X-Fallback-Reason:
  adapter_missing``).

Targets (the LoRA adapter issue): ``adapter_ready_s`` under 10, the fallback p99 within 50 ms
of the plain one.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tinct.api.routing import DATA_KEY, VERSION_ANNOTATION, configmap_name
from tinct_testing.adapter_pods import adapter_pods, adapter_release
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.process import spawned
from tinct_testing.lora_artifacts import adapter_artifacts, make_adapter, make_base
from tinct_testing.modelversion_cluster import mv_doc
from tinct_testing.release_traffic import router
from tinct_testing.wait import eventually

__all__ = ["measure_adapter"]

NS = "bench-adapter"
BODY = json.dumps(
    {"model": "llama3-8b", "messages": [{"role": "user", "content": "which plan suits a team of five?"}]}
).encode()


def _p99(ms: list[float]) -> float:
    ms = sorted(ms)
    return round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2)


def _timed(port: int, n: int, reason: str) -> list[float]:
    """``n`` requests through the router, one connection; each must carry fallback ``reason``."""
    out: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(n):
            t = time.perf_counter()
            conn.request(
                "POST", "/v1/chat/completions", body=BODY, headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            resp.read()
            out.append((time.perf_counter() - t) * 1000)
            got = resp.getheader("X-Fallback-Reason", "-")
            if resp.status != 200 or got != reason:
                raise AssertionError(f"expected 200 with fallback reason {reason}, got {resp.status} {got}")
    finally:
        conn.close()
    return out


def measure_adapter(
    cp: ControlPlane, work: Path, log: Callable[[str], None], pods_n: int = 10, requests: int = 300
) -> dict[str, float]:
    """The adapter keys of the release bench (see the module's docstring)."""
    cp.kubectl("create", "namespace", NS)

    def apply(doc: dict[str, Any]) -> None:
        cp.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(doc))

    def get(kind: str, name: str) -> dict[str, Any]:
        out = cp.kubectl("get", kind, name, "-n", NS, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    base = make_base(work / "adapter" / "base" / "model.safetensors")
    adapter = make_adapter(work / "adapter" / "support", r=8)
    env = {
        **os.environ,
        "KUBECONFIG": str(cp.kubeconfig),
        "TINCT_LINEAGE_ROOT": str(work / "adapter" / "lineage"),
        "TINCT_ARTIFACT_ROOTS": str(work / "adapter"),
        "TINCT_TABLE_NAMESPACE": NS,
        "TINCT_ALLOW_BACKENDS": "127.0.0.0/8",
    }
    argv = [sys.executable, "-m", "tinct.cli", "operator", "--namespace", NS]
    with (
        adapter_pods(cp.kubeconfig, NS, ["vllm"] * pods_n, output_tokens=16) as pods,
        router(NS, work / "adapter-router.log", extra=["--allow-backend", "127.0.0.0/8"]) as rt,
    ):
        apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "sched"},
                "spec": {"selector": {"app": "sched"}, "ports": [{"port": 8000, "targetPort": pods.port}]},
            }
        )
        with spawned(argv, work / "adapter-operator.log", env, grace=20):
            apply(mv_doc("base", [{"format": "safetensors", "uri": base.as_uri()}], runtime="vllm"))
            eventually(
                lambda: (get("modelversion", "base").get("status") or {}).get("phase") == "Ready",
                timeout=120,
                what="the base ModelVersion Ready",
            )
            log(f"adapter release on {pods_n} emulated vLLM pods")
            adapter_doc = mv_doc(
                "support-1-0-0",
                adapter_artifacts(adapter),
                model="support",
                adapter={"baseModelVersion": "base"},
            )
            applied = time.perf_counter()
            apply(adapter_doc)
            # Every request to the adapter, never ejected: each request of the fallback measure
            # tries it first.
            release = adapter_release(
                pods.port, analysis={"interval": "1h", "metrics": []}, weights=[100, 100]
            )
            release["spec"]["fallback"] = {"consecutiveFailures": 1000}
            apply(release)

            def in_force() -> int | None:
                cm = get("configmap", configmap_name(NS, "chat"))
                annotations = (cm.get("metadata") or {}).get("annotations") or {}
                doc = json.loads((cm.get("data") or {}).get(DATA_KEY) or "{}")
                if not any(c.get("weight", 0) > 0 for c in doc.get("cells", [])):
                    return None
                return int(annotations.get(VERSION_ANNOTATION, 0)) or None

            version = eventually(in_force, timeout=120, interval=0.05, what="the first step's table")
            eventually(
                lambda: (rt.table_version() or -1) >= version, timeout=30, interval=0.01, what="the router"
            )
            ready = time.perf_counter() - applied
            served = (
                (get("modelversion", "support-1-0-0").get("status") or {})
                .get("adapter", {})
                .get("servedName")
            )
            held = sum(1 for name in pods.engines if served in pods.adapters(name))
            if held != pods_n:
                raise AssertionError(f"the first step in force with the adapter on {held}/{pods_n} pods")
            log(f"adapter ready in {ready:.2f}s; {requests} requests to pods holding it")
            plain = _timed(rt.port, requests, "-")
        # The operator stopped: nothing loads the adapter again once the engines lose it.
        for name in pods.engines:
            pods.restart(name)
        log(f"{requests} requests to pods that lost it")
        fallback = _timed(rt.port, requests, "adapter_missing")
    return {
        "adapter_ready_s": round(ready, 2),
        "adapter_plain_p99_ms": _p99(plain),
        "adapter_fallback_p99_ms": _p99(fallback),
        "adapter_pods": pods_n,
    }

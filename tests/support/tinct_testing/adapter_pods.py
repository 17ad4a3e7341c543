"""Stable's pods for an adapter release: emulated engines published as Pod objects.

Each engine (vLLM or SGLang, runtime LoRA loading on) listens on its own loopback address
(127.0.0.2, .3, ..., one port for all) and stands for a Pod of Service ``sched``, whose
``status.podIP`` is written through the status subresource: the API server refuses loopback
addresses in EndpointSlices, not in a Pod's status, and no kubelet owns a Pod on node
``nowhere``. The engines run on an event loop of their own, so a test or a benchmark can
block while they serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes import config as kube_config

from tinct.emulator import Behaviour, Emulator, serving

__all__ = ["Pods", "adapter_pods", "adapter_release", "address_of"]


def address_of(i: int) -> str:
    """The loopback address of the ``i``-th pod (from 0)."""
    return f"127.0.0.{i + 2}"


class Pods:
    """Emulated engines, each a Ready Pod ``sched-<i>`` of Service ``sched`` in ``ns``."""

    def __init__(self, kubeconfig: Path, ns: str, engines: list[str], **behaviour: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="pods")
        self.thread.start()
        self._stack = contextlib.AsyncExitStack()
        #: Room for more pods than asked for now: :meth:`add` may bring more later.
        self.port = _free_port_on([address_of(i) for i in range(len(engines) + 4)])
        self.engines: dict[str, Emulator] = {}
        self.addresses: dict[str, str] = {}
        self.api = kube_client.CoreV1Api(
            kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        )
        self.ns = ns
        for engine in engines:
            self.add(engine, **behaviour)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def add(self, engine: str, **behaviour: Any) -> str:
        """Serve one more engine and publish it as a Ready Pod; its name."""
        name = f"sched-{len(self.engines)}"
        address = address_of(len(self.engines))
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
        self.addresses[name] = address
        pod: Any = {
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
        return name

    def set(self, name: str, **changes: Any) -> None:
        """Change the behaviour of pod ``name``'s engine."""
        emu = self.engines[name]

        async def change() -> None:
            emu.set(**changes)

        self._run(change())

    def restart(self, name: str) -> None:
        """Restart pod ``name``'s engine in place (same Pod, same address): its adapters are gone."""
        emu = self.engines[name]

        async def restart() -> None:
            emu.restart()

        self._run(restart())

    def adapters(self, name: str) -> frozenset[str]:
        """The adapters the engine of pod ``name`` holds."""
        return frozenset(self.engines[name].state.adapters)

    def holding(self, served: str) -> frozenset[str]:
        """The addresses of the pods whose engine holds ``served``."""
        return frozenset(a for n, a in self.addresses.items() if served in self.engines[n].state.adapters)

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
def adapter_pods(kubeconfig: Path, ns: str, engines: list[str], **behaviour: Any) -> Iterator[Pods]:
    """:class:`Pods` for the block, stopped after it."""
    pods = Pods(kubeconfig, ns, engines, **behaviour)
    try:
        yield pods
    finally:
        pods.close()


def adapter_release(
    port: int, engine: str = "vllm", analysis: dict[str, Any] | None = None, weights: list[int] | None = None
) -> dict[str, Any]:
    """GrayRelease ``chat`` of the adapter ModelVersion ``support-1-0-0`` on the base ``base``
    served by Service ``sched`` (the pods' ``port``): one cell, ``weights`` (10 then 50)."""
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
                "url": f"http://{address_of(0)}:{port}",
            },
            "candidate": {"adapter": {"modelVersion": "support-1-0-0"}},
            "dye": {"promptLength": {"buckets": [{"name": "all"}]}},
            "cells": [{"match": {}, "weights": weights or [10, 50]}],
            "analysis": analysis or {"interval": "2s", "metrics": []},
        },
    }

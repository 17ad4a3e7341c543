"""Loading a LoRA adapter candidate into stable's pods, and taking it off; acting.

Each round of an adapter release (``spec.candidate.adapter``) finds the pods stable's Service
selects (Pod objects: ``status.podIP``, ``Ready``), asks each engine what it serves
(``GET /v1/models``), and, as :mod:`~tinct.operator.grayrelease.loading` decides, loads the
adapter where it is missing (vLLM ``POST /v1/load_lora_adapter``, SGLang ``POST
/load_lora_adapter``: ``lora_name`` the served name, ``lora_path`` the directory tinct
verified, or its place under ``mountPath``) or unloads it after a rollback once in-flight
requests drained. What it found is returned as ``status.adapter``
(:func:`~tinct.operator.grayrelease.loading.record`); only a pod whose ``/v1/models`` lists
the served name counts as holding it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import aiohttp

from tinct.api.v1alpha1.grayrelease import AdapterRelease, GrayRelease, GrayReleaseStatus
from tinct.operator.grayrelease import loading
from tinct.operator.grayrelease.loading import PodSeen

__all__ = ["LOAD_PATHS", "UNLOAD_PATHS", "sync"]

#: engine -> the path of its runtime load endpoint, and of its unload endpoint.
LOAD_PATHS = {"vllm": "/v1/load_lora_adapter", "sglang": "/load_lora_adapter"}
UNLOAD_PATHS = {"vllm": "/v1/unload_lora_adapter", "sglang": "/unload_lora_adapter"}
_TIMEOUT = aiohttp.ClientTimeout(total=10)
_ANSWER_BYTES = 1 << 20
_log = logging.getLogger(__name__)


def _url(address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"


async def _models(session: aiohttp.ClientSession, address: str, port: int) -> frozenset[str] | None:
    """The model ids the engine at ``address`` lists; None when it does not answer so."""
    try:
        async with session.get(_url(address, port, "/v1/models"), timeout=_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            doc = json.loads(await resp.content.read(_ANSWER_BYTES))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _refusal(status: int, text: str) -> str:
    """The engine's reason, from vLLM's error object or SGLang's error_message."""
    doc = _json(text)
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return f"HTTP {status}: {err['message']}"
        if isinstance(doc.get("error_message"), str) and doc["error_message"]:
            return f"HTTP {status}: {doc['error_message']}"
    return f"HTTP {status}: {text[:512]}"


async def _post(
    session: aiohttp.ClientSession, address: str, port: int, path: str, body: Mapping[str, str]
) -> str | None:
    """POST ``body`` to the engine; None when it did it, else why not."""
    try:
        async with session.post(_url(address, port, path), json=dict(body), timeout=_TIMEOUT) as resp:
            text = (await resp.content.read(_ANSWER_BYTES)).decode("utf-8", "replace")
            if resp.status == 200:
                doc = _json(text)
                if isinstance(doc, dict) and doc.get("success") is False:  # SGLang's refusal
                    return _refusal(resp.status, text)
                return None
            return _refusal(resp.status, text)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _adapter_of(modelversion: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    """(served name, directory, lora digest) a verified adapter ModelVersion recorded."""
    status = (modelversion or {}).get("status") or {}
    adapter = status.get("adapter") or {}
    digest = (status.get("digests") or {}).get("lora")
    return adapter.get("servedName"), adapter.get("path"), digest if isinstance(digest, str) else None


async def sync(
    gr: GrayRelease,
    kube: Any,
    run: Any,
    session: aiohttp.ClientSession,
    modelversions: Mapping[str, Mapping[str, Any] | None],
    now: datetime,
    deleting: bool = False,
) -> AdapterRelease | None:
    """Bring the adapter on stable's pods where the release wants it, and say where it is.

    ``kube`` is the :class:`~tinct.operator.grayrelease.kube.ReleaseKube`, ``run`` the
    runtime's way of calling it off the event loop. None for a release without an adapter.
    """
    spec = gr.spec
    ref = spec.candidate.adapter
    if ref is None:
        return None
    old = gr.status or GrayReleaseStatus()
    served, directory, digest = _adapter_of(modelversions.get(ref.model_version))
    path = loading.engine_path(ref, directory) if directory else None
    ns = gr.metadata.namespace or "default"
    port, found = await run(kube.service_pods, ns, spec.stable.service, spec.stable.port)
    engine = spec.stable.engine
    ready = [(n, a, r) for n, a, r in found if a]
    answers = await asyncio.gather(*(_models(session, a, port) for _, a, r in ready if r))
    listing = iter(answers)
    pods = [PodSeen(n, a, r, next(listing) if r else None) for n, a, r in ready]
    if served is None or engine not in loading.LOADING_ENGINES:
        return loading.record(ref.model_version, served, digest, path, pods, port=port)
    keep = loading.keeps_adapter(old.phase, deleting)
    withdrawn = (old.adapter.withdrawn_at if old.adapter else None) or now
    if keep and path is not None:
        pods = await _load(session, pods, port, engine, served, path)
    elif not keep and loading.drained(withdrawn, now):
        for pod in loading.to_unload(pods, served):
            why = await _post(session, pod.address or "", port, UNLOAD_PATHS[engine], {"lora_name": served})
            if why is None:
                pods = [
                    replace(p, served=(p.served or frozenset()) - {served}) if p is pod else p for p in pods
                ]
            else:
                _log.info("unloading %s from pod %s: %s", served, pod.name, why)
    return loading.record(
        ref.model_version, served, digest, path, pods, wanted=keep, withdrawn_at=withdrawn, port=port
    )


async def _load(
    session: aiohttp.ClientSession, pods: list[PodSeen], port: int, engine: str, served: str, path: str
) -> list[PodSeen]:
    """Load the adapter into the pods missing it; a pod counts as holding it once its
    ``/v1/models`` lists it."""
    missing = loading.to_load(pods, served)
    body = {"lora_name": served, "lora_path": path}
    refusals = await asyncio.gather(
        *(_post(session, p.address or "", port, LOAD_PATHS[engine], body) for p in missing)
    )
    listed = await asyncio.gather(*(_models(session, p.address or "", port) for p in missing))
    after = {
        p.name: replace(p, served=models, refused=why if models is None or served not in models else None)
        for p, why, models in zip(missing, refusals, listed, strict=True)
    }
    return [after.get(p.name, p) for p in pods]

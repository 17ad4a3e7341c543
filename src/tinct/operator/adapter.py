"""Holding a LoRA adapter ModelVersion to its base before anything is served.

An adapter (``spec.adapter.baseModelVersion``) waits for its base to be ``Ready``
(:func:`wait_for_base`: ``BaseCompatible=Unknown`` and a retry, the adapter's files are not
read meanwhile), is verified like any version, and then checked against the base as the
operator recorded it (:func:`check`): the base's safetensors tensors from the lineage
``interfaces`` table, the base's ``maxLoraRank`` and model name
(:func:`~tinct.artifacts.lora.check_against_base`). A mismatch fails the version with
``BaseCompatible=False`` naming the module and both shapes.

The name engines serve the adapter under carries its content's digest
(:func:`served_name`), so a re-upload under the same name is another model to the engines
and what answers can be traced to its lineage row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from tinct.api.v1alpha1.modelversion import AdapterStatus, ModelVersion, ModelVersionStatus
from tinct.artifacts.lora import BaseMismatch, adapter_directory, check_against_base, served_name
from tinct.artifacts.verify import Verification
from tinct.operator import context

__all__ = [
    "DEFAULT_MAX_LORA_RANK",
    "Base",
    "adapter_status",
    "check",
    "max_rank_of",
    "wait_for_base",
]

#: The ``--max-lora-rank`` of an engine started without one, by runtime (vLLM's is 16).
DEFAULT_MAX_LORA_RANK = {"vllm": 16}


@dataclass(frozen=True)
class Base:
    """The base version an adapter runs on, as the API server has it."""

    name: str
    uid: str
    model: str
    version: str
    #: ``spec.maxLoraRank``, else the runtime's default; None: not checked.
    max_rank: int | None
    quantized: bool


def max_rank_of(spec: dict[str, Any]) -> int | None:
    """The largest rank the base's engines accept: its ``maxLoraRank``, else its runtime's default."""
    given = spec.get("maxLoraRank")
    if isinstance(given, int):
        return given
    return DEFAULT_MAX_LORA_RANK.get(str(spec.get("runtime")))


async def _report_waiting(mv: ModelVersion, ctx: context.Context, reason: str, message: str) -> None:
    old = mv.status or ModelVersionStatus()
    status = old.waiting("BaseCompatible", reason, message, mv.metadata.generation, datetime.now(UTC))
    waiting = status.model_dump(by_alias=True, mode="json", include={"phase", "message", "conditions"})
    ns, name = mv.metadata.namespace or "", mv.metadata.name
    await asyncio.get_running_loop().run_in_executor(
        ctx.io, ctx.status.patch_status, "modelversions", ns, name, waiting
    )


async def wait_for_base(mv: ModelVersion, ctx: context.Context, retry: int) -> Base:
    """The adapter's base, once it is Ready.

    Raises:
        kopf.TemporaryError: the base is missing or not Ready yet (said in status first).
    """
    assert mv.spec.adapter is not None
    ns, name = mv.metadata.namespace or "default", mv.spec.adapter.base_model_version
    delay = float(min(30, 5 * 2 ** min(retry, 3)))
    loop = asyncio.get_running_loop()
    try:
        obj = await loop.run_in_executor(ctx.io, ctx.status.get_object, "modelversions", ns, name)
    except Exception as exc:
        raise kopf.TemporaryError(f"could not read base ModelVersion {name}: {exc}", delay=delay) from exc
    if obj is None:
        why = f"base ModelVersion {name} does not exist; apply it (retrying in {delay:g}s)"
        await _report_waiting(mv, ctx, "BaseMissing", why)
        raise kopf.TemporaryError(why, delay=delay)
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("adapter"):
        raise kopf.PermanentError(f"base ModelVersion {name} is an adapter itself; name the base model")
    if status.get("phase") != "Ready":
        why = (
            f"waiting for base ModelVersion {name} to be Ready (it is {status.get('phase') or 'Pending'}; "
            f"retrying in {delay:g}s)"
        )
        await _report_waiting(mv, ctx, "BaseNotReady", why)
        raise kopf.TemporaryError(why, delay=delay)
    quantization = spec.get("quantization") or {}
    return Base(
        name=name,
        uid=str(obj["metadata"].get("uid") or ""),
        model=str(spec.get("model") or ""),
        version=str(spec.get("version") or ""),
        max_rank=max_rank_of(spec),
        quantized=quantization.get("method", "none") not in (None, "none"),
    )


async def check(
    mv: ModelVersion, verification: Verification, base: Base, ctx: context.Context
) -> BaseMismatch | None:
    """Whether the verified adapter fits ``base`` (see the module doc)."""
    from tinct.lineage.interfaces import recorded_interface

    adapter = (verification.interface or {}).get("lora")
    if adapter is None:
        return BaseMismatch("InvalidAdapter", "the version has no lora artifacts to serve as an adapter")
    try:
        recorded = await asyncio.get_running_loop().run_in_executor(
            ctx.io,
            lambda: recorded_interface(base.name, ctx.store.root, uid=base.uid, config=ctx.config.storage),
        )
    except Exception as exc:
        raise kopf.TemporaryError(
            f"could not read the recorded interface of base ModelVersion {base.name}: {exc}", delay=10
        ) from exc
    return check_against_base(
        adapter,
        recorded.interface,
        base_name=base.name,
        base_model=base.model,
        max_rank=base.max_rank,
        quantized=base.quantized,
    )


def adapter_status(mv: ModelVersion, verification: Verification, base: Base) -> AdapterStatus | None:
    """``status.adapter`` of a verified adapter."""
    lora = (verification.interface or {}).get("lora")
    digest = verification.digests.get("lora")
    if lora is None or digest is None:
        return None
    return AdapterStatus(
        base_model_version=base.name,
        base_model=base.model,
        served_name=served_name(mv.spec.model, digest),
        path=adapter_directory([a.uri for a in mv.spec.artifacts if a.format == "lora"]),
        rank=int(lora["max_rank"]),
        modules=len(lora["modules"]),
    )

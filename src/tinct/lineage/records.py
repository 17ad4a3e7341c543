"""Rows for the lineage tables, built from resources; pure functions.

:func:`model_version_rows` turns a ModelVersion and its verification into the rows of
``model_versions``, ``artifacts`` and ``interfaces``; :func:`release_event_rows` builds a
``release_events`` row of a GrayRelease step, and :func:`record_release_event`
writes it through a :class:`~tinct.lineage.writer.BatchWriter`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tinct import __version__
from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.interface import Interface, digest
from tinct.artifacts.lora import served_name
from tinct.artifacts.verify import Verification
from tinct.lineage.schemas import model_version_event_id, release_event_id
from tinct.lineage.writer import BatchWriter

__all__ = ["BaseRef", "Rows", "model_version_rows", "record_release_event", "release_event_rows"]

Rows = dict[str, list[dict[str, Any]]]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BaseRef:
    """The base version a LoRA adapter was checked against."""

    name: str
    uid: str
    model: str
    version: str


def model_version_rows(
    mv: ModelVersion,
    event: str,
    verification: Verification | None = None,
    *,
    now: datetime | None = None,
    operator_version: str = __version__,
    base: BaseRef | None = None,
) -> Rows:
    """Rows recording ``event`` (registered/updated/failed/retired) of ``mv``; with ``base``
    (an adapter's, checked against it) an ``adapters`` row of its facts too."""
    meta, spec = mv.metadata, mv.spec
    uid = meta.uid or ""
    generation = int(meta.generation or 0)
    event_id = model_version_event_id(uid, generation, event)
    ts = now or _now()
    digests = verification.digests if verification else {}
    failure = verification.failure if verification else None
    q = spec.quantization
    # The columns naming this event of this version, which the rows of every table carry
    # (``artifacts`` without the resource's name).
    event_key: dict[str, Any] = {
        "event_id": event_id,
        "uid": uid,
        "generation": generation,
        "model": spec.model,
        "version": spec.version,
    }
    named = {**event_key, "namespace": meta.namespace, "name": meta.name}
    row: dict[str, Any] = {
        **named,
        "event": event,
        "onnx_sha256": digests.get("onnx"),
        "ptx_sha256": digests.get("ptx"),
        "safetensors_sha256": digests.get("safetensors"),
        "source_sha256": digests.get("source"),
        "source_uri": spec.source.uri if spec.source else None,
        "build_pipeline_id": spec.build_pipeline_id,
        "quantization_method": q.method if q else None,
        "quantization_bits": q.bits if q else None,
        "quantization_symmetric": q.symmetric if q else None,
        "quantization_group_size": q.group_size if q else None,
        "runtime": spec.runtime,
        "reason": failure.reason if failure else None,
        "message": failure.message if failure else None,
        "operator_version": operator_version,
        "recorded_at": ts,
    }
    artifacts = [
        {
            **event_key,
            "uri": d.uri,
            "format": fmt,
            "sha256": d.sha256,
            "size": d.size,
            "recorded_at": ts,
        }
        for fmt, d in (verification.files if verification else [])
    ]
    interface = (verification.interface if verification else None) or {}
    interface_digest = digest(interface)  # once: the interface of half a million tensors is big
    interfaces = [
        {
            **named,
            "recorded_at": ts,
            **interface_columns(fmt, uri, facts, interface, interface_digest),
        }
        for fmt, uri, facts in (verification.facts if verification else [])
    ]
    rows: Rows = {"model_versions": [row], "artifacts": artifacts, "interfaces": interfaces}
    lora = interface.get("lora")
    if base is not None and lora is not None:
        lora_digest = digests.get("lora")
        targets = lora.get("target_modules")
        rows["adapters"] = [
            {
                **named,
                "base_model_version": base.name,
                "base_uid": base.uid,
                "base_model": base.model,
                "base_version": base.version,
                "peft_type": lora.get("peft_type"),
                "rank": lora.get("max_rank"),
                "lora_alpha": float(lora["lora_alpha"]) if lora.get("lora_alpha") is not None else None,
                "target_modules": targets if isinstance(targets, list) else [str(targets)],
                "modules": len(lora.get("modules") or {}),
                "config_base_model": lora.get("base_model"),
                "lora_sha256": lora_digest,
                "served_name": served_name(spec.model, lora_digest) if lora_digest else None,
                "recorded_at": ts,
            }
        ]
    return rows


def _io(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for name, v in values.items():
        shape = v.get("shape")
        dims = "?" if shape is None else ",".join("?" if d is None else str(d) for d in shape)
        out.append((name, f"{v['dtype']}[{dims}]" + (" optional" if v.get("optional") else "")))
    return out


def interface_columns(
    fmt: str, uri: str, facts: Mapping[str, Any], interface: Interface, interface_digest: str
) -> dict[str, Any]:
    """The ``interfaces`` columns of one artifact (all but the identity of the version);
    ``interface_digest`` is ``digest(interface)``."""
    st = (interface.get("safetensors") or {}) if fmt == "safetensors" else {}
    return {
        "uri": uri,
        "format": fmt,
        "interface_digest": interface_digest,
        "inputs": _io(facts["inputs"]) if "inputs" in facts else None,
        "outputs": _io(facts["outputs"]) if "outputs" in facts else None,
        "opsets": list(facts["opsets"].items()) if "opsets" in facts else None,
        "metadata": list(facts["metadata"].items()) if "metadata" in facts else None,
        "tensor_count": len(facts["tensors"]) if "tensors" in facts else None,
        "vocab_size": facts.get("vocab_size", st.get("vocab_size")),
        "hidden_size": st.get("hidden_size"),
        "layers": st.get("layers"),
        "ptx_version": facts.get("version") if fmt == "ptx" else None,
        "ptx_target": facts.get("target") if fmt == "ptx" else None,
        "address_size": facts.get("address_size"),
        "entries": facts.get("entries"),
        "vocab_digest": facts.get("vocab_digest"),
        "special_tokens": list(facts["special_tokens"].items()) if "special_tokens" in facts else None,
        "chat_template_digest": facts.get("chat_template_digest"),
        "facts": json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
    }


def release_event_rows(
    *,
    release: str,
    namespace: str | None,
    uid: str,
    generation: int,
    step: int,
    state: str,
    from_model_version: str | None = None,
    to_model_version: str | None = None,
    weights: Mapping[str, float] | None = None,
    metrics: Mapping[str, float] | None = None,
    reason: str | None = None,
    event_id: str | None = None,
    now: datetime | None = None,
    operator_version: str = __version__,
) -> Rows:
    """A ``release_events`` row; ``event_id`` defaults to uid/generation/step/state."""
    return {
        "release_events": [
            {
                "event_id": event_id or release_event_id(uid, generation, step, state),
                "release": release,
                "namespace": namespace,
                "uid": uid,
                "generation": generation,
                "from_model_version": from_model_version,
                "to_model_version": to_model_version,
                "step": step,
                "state": state,
                "weights": list((weights or {}).items()),
                "reason": reason,
                "metrics": list((metrics or {}).items()),
                "operator_version": operator_version,
                "recorded_at": now or _now(),
            }
        ]
    }


def record_release_event(writer: BatchWriter, **fields: Any) -> Future[int]:
    """Queue a release event (see :func:`release_event_rows`); resolves to its Delta version."""
    return writer.submit(release_event_rows(**fields), version_of="release_events")

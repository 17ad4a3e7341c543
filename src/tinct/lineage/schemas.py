"""Schemas of the lineage tables and the keys that make writes idempotent.

Every table has a string ``event_id`` (plus ``uri`` for ``artifacts``) that identifies
one recorded fact; writes MERGE on it so a retried reconcile never adds a row twice.

- ``model_versions.event_id`` = ``"<uid>/<generation>/<event>"``; ``retired`` is keyed
  ``"<uid>/retired"`` because an object retires once, whatever its generation.
- ``artifacts`` key = ``event_id`` (of the model_versions row) + ``uri``.
- ``interfaces`` (one row per artifact of a verified version, its interface facts) key =
  ``event_id`` + ``uri``, like ``artifacts``.
- ``adapters`` (one row per recorded event of a LoRA adapter version: its facts and its base)
  key = ``event_id``, the event's ``model_versions`` key.
- ``release_events.event_id`` = ``"<uid>/<generation>/<step>/<state>"`` by default
  (see :func:`release_event_id`).
- ``shadow_pairs.event_id`` = a digest of the pair as the router sent it: a pair sent twice is
  one row. The comparer (``tinct comparer``) writes this table, and only it
  (:data:`COMPARER_TABLES`); the operator writes the others (:data:`OPERATOR_TABLES`).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ADAPTERS",
    "ARTIFACTS",
    "COMPARER_TABLES",
    "INTERFACES",
    "KEYS",
    "MODEL_VERSIONS",
    "MODEL_VERSION_EVENTS",
    "OPERATOR_TABLES",
    "RELEASE_EVENTS",
    "SCHEMAS",
    "SHADOW_PAIRS",
    "model_version_event_id",
    "release_event_id",
]

_TS = pa.timestamp("us", tz="UTC")

#: Events of a ModelVersion's life.
MODEL_VERSION_EVENTS = ("registered", "updated", "failed", "retired")

MODEL_VERSIONS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("name", pa.string()),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("onnx_sha256", pa.string()),
        pa.field("ptx_sha256", pa.string()),
        pa.field("safetensors_sha256", pa.string()),
        pa.field("source_sha256", pa.string()),
        pa.field("source_uri", pa.string()),
        pa.field("build_pipeline_id", pa.string()),
        pa.field("quantization_method", pa.string()),
        pa.field("quantization_bits", pa.int32()),
        pa.field("quantization_symmetric", pa.bool_()),
        pa.field("quantization_group_size", pa.int32()),
        pa.field("runtime", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("message", pa.string()),
        pa.field("operator_version", pa.string()),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

ARTIFACTS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("uri", pa.string(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

#: One row per artifact of a verified ModelVersion: its interface facts as columns, and the
#: whole facts as JSON (``facts``) from which :func:`tinct.artifacts.interface.combine`
#: rebuilds the version's interface. Architecture facts of safetensors (vocab_size,
#: hidden_size, layers) are the version's, from all shards, on each shard's row.
INTERFACES = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("name", pa.string()),
        pa.field("uri", pa.string(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("interface_digest", pa.string(), nullable=False),
        pa.field("inputs", pa.map_(pa.string(), pa.string())),
        pa.field("outputs", pa.map_(pa.string(), pa.string())),
        pa.field("opsets", pa.map_(pa.string(), pa.int64())),
        pa.field("metadata", pa.map_(pa.string(), pa.string())),
        pa.field("tensor_count", pa.int64()),
        pa.field("vocab_size", pa.int64()),
        pa.field("hidden_size", pa.int64()),
        pa.field("layers", pa.int64()),
        pa.field("ptx_version", pa.string()),
        pa.field("ptx_target", pa.string()),
        pa.field("address_size", pa.int32()),
        pa.field("entries", pa.list_(pa.string())),
        pa.field("vocab_digest", pa.string()),
        pa.field("special_tokens", pa.map_(pa.string(), pa.string())),
        pa.field("chat_template_digest", pa.string()),
        pa.field("facts", pa.string(), nullable=False),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

#: One row per recorded event (registered, updated, failed) of a LoRA adapter ModelVersion: its
#: PEFT facts, the base version it was checked against, and the name engines serve it under;
#: ``model_lineage`` joins it to ``model_versions`` by ``event_id``.
ADAPTERS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("name", pa.string()),
        pa.field("base_model_version", pa.string(), nullable=False),
        pa.field("base_uid", pa.string()),
        pa.field("base_model", pa.string()),
        pa.field("base_version", pa.string()),
        pa.field("peft_type", pa.string()),
        pa.field("rank", pa.int64()),
        pa.field("lora_alpha", pa.float64()),
        pa.field("target_modules", pa.list_(pa.string())),
        pa.field("modules", pa.int64()),
        pa.field("config_base_model", pa.string()),
        pa.field("lora_sha256", pa.string()),
        pa.field("served_name", pa.string()),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

RELEASE_EVENTS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("release", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("generation", pa.int64()),
        pa.field("from_model_version", pa.string()),
        pa.field("to_model_version", pa.string()),
        pa.field("step", pa.int32()),
        pa.field("state", pa.string(), nullable=False),
        pa.field("weights", pa.map_(pa.string(), pa.float64())),
        pa.field("reason", pa.string()),
        pa.field("metrics", pa.map_(pa.string(), pa.float64())),
        pa.field("operator_version", pa.string()),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

#: One row per mirrored request compared: both answers' verdict, the layer that decided, the
#: judge's word; the prompt and answers as hashes and lengths, their text only with the
#: release's ``shadow.keepText`` (cut to ``maxTextBytes``).
SHADOW_PAIRS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("release", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("uid", pa.string(), nullable=False),
        pa.field("table_version", pa.int64()),
        pa.field("cell", pa.string()),
        pa.field("dye_tag", pa.string(), nullable=False),
        pa.field("target", pa.string(), nullable=False),
        pa.field("stable_model_version", pa.string()),
        pa.field("candidate_model_version", pa.string()),
        pa.field("path", pa.string()),
        pa.field("deterministic", pa.bool_()),
        pa.field("prompt_sha256", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("stable_status", pa.int32()),
        pa.field("candidate_status", pa.int32()),
        pa.field("stable_bytes", pa.int64()),
        pa.field("candidate_bytes", pa.int64()),
        pa.field("stable_ms", pa.float64()),
        pa.field("candidate_ms", pa.float64()),
        pa.field("stable_sha256", pa.string()),
        pa.field("candidate_sha256", pa.string()),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("layer", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("similarity", pa.float64()),
        pa.field("judge_outcome", pa.string()),
        pa.field("judge_confidence", pa.float64()),
        pa.field("judge_reasoning", pa.string()),
        pa.field("prompt_text", pa.string()),
        pa.field("stable_text", pa.string()),
        pa.field("candidate_text", pa.string()),
        pa.field("requested_at", _TS),
        pa.field("recorded_at", _TS, nullable=False),
    ]
)

#: Table name -> schema.
SCHEMAS: dict[str, pa.Schema] = {
    "model_versions": MODEL_VERSIONS,
    "artifacts": ARTIFACTS,
    "interfaces": INTERFACES,
    "adapters": ADAPTERS,
    "release_events": RELEASE_EVENTS,
    "shadow_pairs": SHADOW_PAIRS,
}

#: The tables the comparer writes (creates, appends to, maintains); the operator never does.
COMPARER_TABLES: tuple[str, ...] = ("shadow_pairs",)
#: The tables the operator writes.
OPERATOR_TABLES: tuple[str, ...] = tuple(t for t in SCHEMAS if t not in COMPARER_TABLES)

#: Table name -> columns that identify a row (the MERGE key).
KEYS: dict[str, tuple[str, ...]] = {
    "model_versions": ("event_id",),
    "artifacts": ("event_id", "uri"),
    "interfaces": ("event_id", "uri"),
    "adapters": ("event_id",),
    "release_events": ("event_id",),
    "shadow_pairs": ("event_id",),
}


def model_version_event_id(uid: str, generation: int, event: str) -> str:
    if event == "retired":
        return f"{uid}/retired"
    return f"{uid}/{generation}/{event}"


def release_event_id(uid: str, generation: int, step: int, state: str) -> str:
    return f"{uid}/{generation}/{step}/{state}"

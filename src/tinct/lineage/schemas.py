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

#: Events of a ModelVersion's life, the values of ``model_versions.event``.
MODEL_VERSION_EVENTS = ("registered", "updated", "failed", "retired")


def _text(name: str, *, required: bool = False) -> pa.Field:
    return pa.field(name, pa.string(), nullable=not required)


def _texts(*names: str) -> list[pa.Field]:
    return [_text(n) for n in names]


def _maps(*names: str, values: pa.DataType | None = None) -> list[pa.Field]:
    """Maps from text to ``values`` (text when None)."""
    return [pa.field(n, pa.map_(pa.string(), values or pa.string())) for n in names]


#: Every table ends with the time its row was recorded.
_RECORDED_AT = pa.field("recorded_at", _TS, nullable=False)
#: The columns that start a row about one file of a recorded ModelVersion event.
_OF_VERSION = [
    _text("event_id", required=True),
    _text("uid", required=True),
    pa.field("generation", pa.int64(), nullable=False),
    _text("model", required=True),
    _text("version", required=True),
]

MODEL_VERSIONS = pa.schema(
    [
        _text("event_id", required=True),
        _text("event", required=True),
        _text("model", required=True),
        _text("version", required=True),
        *_texts("namespace", "name"),
        _text("uid", required=True),
        pa.field("generation", pa.int64(), nullable=False),
        *_texts(
            "onnx_sha256",
            "ptx_sha256",
            "safetensors_sha256",
            "source_sha256",
            "source_uri",
            "build_pipeline_id",
            "quantization_method",
        ),
        pa.field("quantization_bits", pa.int32()),
        pa.field("quantization_symmetric", pa.bool_()),
        pa.field("quantization_group_size", pa.int32()),
        *_texts("runtime", "reason", "message", "operator_version"),
        _RECORDED_AT,
    ]
)

ARTIFACTS = pa.schema(
    [
        *_OF_VERSION,
        _text("uri", required=True),
        _text("format", required=True),
        _text("sha256", required=True),
        pa.field("size", pa.int64(), nullable=False),
        _RECORDED_AT,
    ]
)

#: One row per artifact of a verified ModelVersion: its interface facts as columns, and the
#: whole facts as JSON (``facts``) from which :func:`tinct.artifacts.interface.combine`
#: rebuilds the version's interface. Architecture facts of safetensors (vocab_size,
#: hidden_size, layers) are the version's, from all shards, on each shard's row.
INTERFACES = pa.schema(
    [
        *_OF_VERSION,
        *_texts("namespace", "name"),
        _text("uri", required=True),
        _text("format", required=True),
        _text("interface_digest", required=True),
        *_maps("inputs", "outputs"),
        *_maps("opsets", values=pa.int64()),
        *_maps("metadata"),
        *[pa.field(n, pa.int64()) for n in ("tensor_count", "vocab_size", "hidden_size", "layers")],
        *_texts("ptx_version", "ptx_target"),
        pa.field("address_size", pa.int32()),
        pa.field("entries", pa.list_(pa.string())),
        _text("vocab_digest"),
        *_maps("special_tokens"),
        _text("chat_template_digest"),
        _text("facts", required=True),
        _RECORDED_AT,
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

#: One row per recorded transition of a GrayRelease; ``step`` counts from 1, as ``2/4`` reads
#: (the operator's rows are keyed ``<uid>/<transition>/<state>/<step index>``).
RELEASE_EVENTS = pa.schema(
    [
        _text("event_id", required=True),
        _text("release", required=True),
        _text("namespace"),
        _text("uid", required=True),
        pa.field("generation", pa.int64()),
        *_texts("from_model_version", "to_model_version"),
        pa.field("step", pa.int32()),
        _text("state", required=True),
        *_maps("weights", values=pa.float64()),
        _text("reason"),
        *_maps("metrics", values=pa.float64()),
        _text("operator_version"),
        _RECORDED_AT,
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
    """The key of ``event`` (one of :data:`MODEL_VERSION_EVENTS`) of generation ``generation``."""
    if event not in MODEL_VERSION_EVENTS:
        raise ValueError(f"{event!r} is not a ModelVersion event ({', '.join(MODEL_VERSION_EVENTS)})")
    if event == "retired":
        return f"{uid}/retired"
    return f"{uid}/{generation}/{event}"


def release_event_id(uid: str, generation: int, step: int, state: str) -> str:
    return f"{uid}/{generation}/{step}/{state}"

"""What an emulated engine does: one validated model, set by flags, environment or at runtime.

Every knob is a field of :class:`Behaviour` with its bounds; the command's flags and
``TINCT_EMULATOR_*`` variables are generated from the fields (:func:`from_env`), and the
control endpoint takes a JSON object of some of them (:func:`updated`), so the three ways in
cannot disagree on a name or a bound.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ENV_PREFIX", "Behaviour", "BehaviourError", "Contract", "Engine", "from_env", "updated"]

Engine = Literal["vllm", "sglang", "tgi"]
#: How the answers keep (``ok``) or break the OpenAI API contract:
#: ``sse-unframed`` streams events as bare JSON lines (no ``data:``) and no ``[DONE]``;
#: ``sse-no-done`` frames them but never sends ``data: [DONE]``;
#: ``error-body`` answers 429 and 5xx with plain text instead of an OpenAI error object;
#: ``no-choices`` leaves ``choices`` out of whole answers and stream chunks.
Contract = Literal["ok", "sse-unframed", "sse-no-done", "error-body", "no-choices"]

#: Environment variables are ``TINCT_EMULATOR_<FIELD>`` (upper case).
ENV_PREFIX = "TINCT_EMULATOR_"


class BehaviourError(ValueError):
    """Settings that do not validate; the message names each field and what is wrong."""


class Behaviour(BaseModel):
    """The emulated engine's behaviour. Times are milliseconds, rates fractions of requests."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    engine: Engine = "vllm"
    """engine whose /metrics names are exported"""
    alt_names: bool = False
    """export the engine's alternate metric names instead: vLLM's names before 0.9 (gpu_cache_usage_perc,
    gpu_prefix_cache_*, time_per_output_token_seconds), SGLang's underscore form (sglang_num_queue_reqs,
    ...)"""
    model: str = Field(default="emulated", min_length=1, max_length=253, pattern=r"^[^\s]+$")
    """model name served (in /v1/models and the metrics' model_name)"""
    ttft_ms: float = Field(default=20.0, ge=0, le=600_000)
    """prefill: from getting a slot to the first token"""
    itl_ms: float = Field(default=5.0, ge=0, le=60_000)
    """gap between output tokens"""
    output_tokens: int = Field(default=16, ge=1, le=100_000)
    """tokens per answer (less when the request's max_tokens is)"""
    head_delay_ms: float = Field(default=0.0, ge=0, le=600_000)
    """wait before any answer at all (response head included)"""
    error_rate: float = Field(default=0.0, ge=0, le=1)
    """share of requests answered 5xx"""
    error_status: int = Field(default=503, ge=500, le=599)
    """status of those answers"""
    throttle_rate: float = Field(default=0.0, ge=0, le=1)
    """share of requests answered 429 (rate limited)"""
    contract: Contract = "ok"
    """keep or break the OpenAI API contract"""
    accept_versions: list[str] = Field(default_factory=list, max_length=32)
    """X-Scheduler-Version values served; any other gets 426 (empty: all)"""
    cut_after_tokens: int | None = Field(default=None, ge=0, le=100_000)
    """drop the connection after this many tokens of a stream"""
    slots: int = Field(default=8, ge=1, le=4096)
    """requests generated at once; more wait in the queue"""
    kv_capacity_tokens: int = Field(default=16384, ge=1, le=10_000_000)
    """KV cache size in tokens (prompt + output held)"""
    prefix_hit_rate: float = Field(default=0.5, ge=0, le=1)
    """share of prompt tokens found in the prefix cache"""

    drift_rate: float = Field(default=0.0, ge=0, le=1)
    """share of prompts (picked by a hash of the prompt: the same prompt always) answered with other words
    ("Drifted reply: ..."), as a model that answers differently"""
    drift_marker: str | None = Field(default=None, min_length=1, max_length=256)
    """prompts containing this text are always answered with other words (drift in one cell: put the marker in
    that cell's prompts)"""
    noise_rate: float = Field(default=0.0, ge=0, le=1)
    """share of sampled answers (temperature above 0, no seed) with one word replaced at random, as sampling
    does"""
    noise_rate_deterministic: float = Field(default=0.0, ge=0, le=1)
    """the same for requests with temperature 0 or a seed, as batch nondeterminism does"""
    json_add_field: str | None = Field(default=None, min_length=1, max_length=64)
    """a field added to JSON answers (response_format json_object or json_schema); they hold answer,
    confidence and sources"""
    json_drop_field: str | None = Field(default=None, min_length=1, max_length=64)
    """a field left out of JSON answers"""
    tool_order: Literal["given", "reversed", "shuffled"] = "given"
    """order of the tool calls answered to a request with tools (one call per tool)"""
    tool_drop: bool = False
    """leave the last tool call out"""

    runtime_lora: bool = False
    """load and unload LoRA adapters at run time (vLLM with --enable-lora and
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=true: /v1/load_lora_adapter; SGLang with --enable-lora:
    /load_lora_adapter) and serve each as a model of its own; off, those endpoints answer 404 and any model
    name is answered by the base"""
    max_lora_rank: int = Field(default=16, ge=1, le=1024)
    """largest adapter rank r a load accepts (--max-lora-rank)"""
    max_loras: int = Field(default=4, ge=0, le=1024)
    """adapters held at once; a load beyond it is refused as out of memory (0: every load)"""
    lora_load_ms: float = Field(default=0.0, ge=0, le=600_000)
    """time a load takes before it answers"""

    def public(self) -> dict[str, Any]:
        """The settings as JSON-able data (what the control endpoint answers)."""
        return self.model_dump(mode="json")


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "settings"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def updated(current: Behaviour, changes: Mapping[str, Any]) -> Behaviour:
    """``current`` with ``changes`` (field name -> value) applied, validated as a whole.

    Raises:
        BehaviourError: an unknown field, or a value out of its bounds.
    """
    try:
        return Behaviour.model_validate({**current.model_dump(), **changes})
    except ValidationError as e:
        raise BehaviourError(_explain(e)) from None


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def from_env(environ: Mapping[str, str] | None = None, **flags: Any) -> Behaviour:
    """The defaults, overridden by ``TINCT_EMULATOR_*`` variables, overridden by ``flags``
    (field name -> value; None means not given).

    A list variable is comma-separated; a boolean is ``true``/``false``/``1``/``0``; an
    empty optional means unset.

    Raises:
        BehaviourError: a value that does not validate, named by its variable or flag.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, info in Behaviour.model_fields.items():
        raw = env.get(env_name(name))
        if raw is None:
            continue
        if name == "accept_versions":
            values[name] = [v for v in raw.split(",") if v]
        elif info.annotation is bool or name == "alt_names":
            values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif raw == "" and not info.is_required() and info.default is None:
            values[name] = None
        else:
            values[name] = raw
    try:
        base = Behaviour.model_validate(values)
    except ValidationError as e:
        raise BehaviourError(f"{_explain(e)} (from the {ENV_PREFIX}* environment)") from None
    given = {k: v for k, v in flags.items() if v is not None}
    return updated(base, given) if given else base

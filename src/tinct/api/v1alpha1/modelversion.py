"""ModelVersion: one version of a model and its artifacts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from tinct.api.v1alpha1.common import (
    DNS_NAME,
    MESSAGE_MAX,
    Condition,
    Message,
    Model,
    Resource,
    set_condition,
)
from tinct.api.v1alpha1.rules import Rule, cel, cel_format

#: semver 2.0.0, https://semver.org (no leading "v"); RE2 and Python alike.
SEMVER = (
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-((0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(\+([0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*))?$"
)
_SEMVER_HELP = "MAJOR.MINOR.PATCH such as 2.0.0, optionally with -rc.1 or +build.5 (no leading v)"
#: Where artifacts can live: a volume mounted into the operator, or an object store.
ARTIFACT_URI = r"^(file|s3|gs|az)://.+$"
SHA256 = r"^[a-f0-9]{64}$"

ArtifactFormat = Literal["onnx", "ptx", "safetensors", "tokenizer", "lora"]
QuantizationMethod = Literal["none", "awq", "gptq", "fp8", "int8", "smoothquant"]
Runtime = Literal["tensorrt-llm", "vllm", "onnxruntime", "triton", "tgi", "llama-cpp"]
#: Misversioned: verified and recorded, but its interface changed more than its declared
#: version step allows (condition InterfaceCompatible=False); it cannot be released as declared.
ModelVersionPhase = Literal["Pending", "Hashing", "Ready", "Misversioned", "Failed", "Retired"]
#: The condition that is True exactly when the phase is Ready (``kubectl wait --for=condition=Ready``).
READY = "Ready"

Uri = Annotated[
    str,
    Field(
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="file:// (a volume mounted into the operator), s3://, gs:// or az://.",
    ),
]
Digest = Annotated[
    str, Field(pattern=SHA256, description="Lowercase hex SHA-256.", min_length=64, max_length=64)
]


class Source(Model):
    """The training checkpoint the artifacts were built from; hashed too."""

    uri: Uri
    sha256: Digest | None = None
    """Expected digest; a mismatch fails the version."""


class Artifact(Model):
    """One file of the version. Several files of one format (shards) are allowed."""

    format: ArtifactFormat
    """What the file is; its content is validated against it. safetensors includes the shards' index
    (*.safetensors.index.json); tokenizer is tokenizer.json or tokenizer_config.json; lora is a PEFT LoRA
    adapter's adapter_config.json or adapter_model.safetensors (an adapter, spec.adapter, has these two,
    side by side in one directory)."""
    uri: Uri
    sha256: Digest | None = None
    """Expected digest; a mismatch fails the version."""


class Quantization(Model):
    """How the weights are quantized; checked against the runtime (e.g. awq needs vllm, tgi or
    tensorrt-llm)."""

    method: QuantizationMethod = "none"
    """Quantization method (default none)."""
    bits: Literal[2, 3, 4, 8, 16] | None = None
    """Bits per weight after quantization, e.g. 4 for AWQ int4."""
    symmetric: bool = True
    """Symmetric quantization (no zero point); default true."""
    group_size: int | None = Field(default=None, ge=1, le=65536)
    """Weights per quantization group (AWQ/GPTQ), e.g. 128."""


class AdapterOf(Model):
    """This version is a LoRA adapter: the base version it runs on."""

    base_model_version: str = Field(pattern=DNS_NAME, min_length=1, max_length=253)
    """Name of the ModelVersion (same namespace) of the base model the adapter was trained on. It must be
    Ready; the adapter's tensor shapes are checked against its weights, its rank against its maxLoraRank,
    and adapter_config.json's base_model_name_or_path must name its model."""


_ADAPTER_FILES = Rule(
    cel="has(self.adapter) ? self.artifacts.all(a, a.format == 'lora') "
    ": self.artifacts.all(a, a.format != 'lora')",
    holds=lambda s: all((a.format == "lora") == (s.adapter is not None) for a in s.artifacts),
    message="an adapter (spec.adapter) has only lora artifacts, and lora artifacts belong to an "
    "adapter: give spec.adapter.baseModelVersion with adapter_config.json and "
    "adapter_model.safetensors, or another format",
    field_path=".artifacts",
)


class ModelVersionSpec(Model):
    """One version of a model: its artifacts (hashed and validated), where they came from,
    and how they are quantized and served."""

    model_config = cel(
        _ADAPTER_FILES,
        Rule(
            cel=f"self.version.matches(r'{SEMVER}')",
            holds=lambda s: re.fullmatch(SEMVER, s.version) is not None,
            message=f"version must be a semantic version: {_SEMVER_HELP}",
            field_path=".version",
            message_expression=cel_format(
                f"'%s' is not a semantic version: write {_SEMVER_HELP}", "self.version"
            ),
            describe=lambda s: f"'{s.version}' is not a semantic version: write {_SEMVER_HELP}",
        ),
    )

    model: str = Field(pattern=DNS_NAME, min_length=1, max_length=253)
    """Model family, e.g. llama3-8b."""
    version: str = Field(min_length=1, max_length=128)
    """Semantic version (semver 2.0.0) of this model version, e.g. 2.0.0 or 2.1.0-rc.1; the interface change
    from the previous version must fit its step."""
    source: Source | None = None
    """The training checkpoint the artifacts were built from; hashed too."""
    artifacts: list[Artifact] = Field(min_length=1, max_length=256)
    """The version's files (1 to 256): ONNX models, PTX kernels, safetensors shards and their index, tokenizer
    files. Each is read, hashed and validated against its format."""
    build_pipeline_id: str | None = Field(default=None, max_length=256)
    """The CI run that built the artifacts, e.g. ci-4812; recorded in lineage."""
    quantization: Quantization | None = None
    """How the weights are quantized; omitted: not quantized."""
    runtime: Runtime | None = None
    """Serving runtime; quantization x runtime is checked."""
    adapter: AdapterOf | None = None
    """This version is a LoRA adapter (lora artifacts) of the base ModelVersion named here, served as a name
    of its own on the pods that serve the base; none: a model of its own."""
    max_lora_rank: int | None = Field(default=None, ge=1, le=4096)
    """For a base model: the largest LoRA rank r its serving engines accept (vLLM's and SGLang's
    --max-lora-rank); an adapter of this base with a larger r fails. Default: 16 (vLLM's default) when
    runtime is vllm, else not checked."""


class Digests(Model):
    """Per-format SHA-256 digests; for a format with several files, the digest of their
    manifest (each file's name and digest)."""

    onnx: str | None = None
    """Digest of the ONNX file(s)."""
    ptx: str | None = None
    """Digest of the PTX file(s)."""
    safetensors: str | None = None
    """Digest of the safetensors shards and index."""
    tokenizer: str | None = None
    """Digest of the tokenizer file(s)."""
    lora: str | None = None
    """Digest of the LoRA adapter's files (adapter_config.json and weights)."""
    source: str | None = None
    """Digest of the source checkpoint."""


class ArtifactStatus(Model):
    """One artifact as the operator read it."""

    uri: str
    """The artifact's URI, as in spec.artifacts."""
    format: str
    """Its format: onnx, ptx, safetensors, tokenizer or lora."""
    sha256: str
    """Its SHA-256, lowercase hex."""
    size: int = Field(ge=0)
    """Its size in bytes."""


class LineageRef(Model):
    """Where this version's last event is recorded in the lineage tables."""

    table: str
    """URI of the model_versions Delta table."""
    version: int = Field(ge=0)
    """Delta table version that holds this event."""


class InterfaceStatus(Model):
    """What the artifacts offer clients, as the operator measured it."""

    digest: str
    """SHA-256 of the interface facts (equal interfaces, equal digests)."""
    summary: str = Field(default="", max_length=1024)
    """The interface in one line."""
    compared_with: str | None = Field(default=None, max_length=512)
    """The ModelVersion (name@version) the interface was compared with, if any."""


class AdapterStatus(Model):
    """A verified LoRA adapter: what it runs on and the name engines serve it under."""

    base_model_version: str
    """The base ModelVersion it was checked against."""
    base_model: str | None = None
    """The base's model."""
    served_name: str = Field(max_length=253)
    """The model name engines serve it under: <model>-<first 12 hex of its lora digest>, distinct per adapter
    content (a re-upload under the same name never meets a stale cache)."""
    path: str = Field(max_length=2048)
    """The directory of its files (what an engine is told to load)."""
    rank: int = Field(ge=1)
    """Its largest rank r."""
    modules: int = Field(ge=0)
    """The base modules it adapts."""


class Progress(Model):
    """How far hashing has come, while the phase is Hashing."""

    bytes_done: int = Field(default=0, ge=0)
    """Bytes read and hashed so far."""
    bytes_total: int = Field(default=0, ge=0)
    """Bytes of all artifacts and the source together."""


class ModelVersionStatus(Model):
    """The ModelVersion as the operator verified and recorded it; written by the operator only."""

    phase: ModelVersionPhase = "Pending"
    """Pending (not verified yet, or verified and recorded but waiting for an earlier version of its model to
    be compared with), Hashing (reading the artifacts), Ready (verified and recorded), Misversioned (its
    interface changed more than its version step allows), Failed (the message says why) or Retired (being
    deleted)."""
    message: Message | None = Field(default=None, max_length=MESSAGE_MAX)
    """What the phase means for this version, in a line."""
    observed_generation: int | None = None
    """The metadata.generation this status was written for."""
    digests: Digests | None = None
    """SHA-256 digests per format, once verified."""
    artifacts: list[ArtifactStatus] | None = None
    """Every artifact as read: URI, format, digest and size."""
    interface: InterfaceStatus | None = None
    """What the artifacts offer clients, as measured while validating them."""
    adapter: AdapterStatus | None = None
    """For a LoRA adapter: its base and the name engines serve it under."""
    progress: Progress | None = None
    """Bytes hashed so far, while Hashing."""
    lineage: LineageRef | None = None
    """The lineage table and Delta version holding this version's last event."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (verified, recorded and usable: kubectl wait --for=condition=Ready; False with the reason of what
    holds it), Verified (artifacts hashed and valid), InterfaceCompatible (the version step fits the
    interface change), BaseCompatible (an adapter fits its base), and others; each reason has a section in
    docs/troubleshooting.md."""

    def held(
        self, type_: str, reason: str, message: str, generation: int | None, now: datetime
    ) -> ModelVersionStatus:
        """This status with ``reason`` holding the version: condition ``type_`` Unknown, Ready
        False, the message saying why; the phase as it is."""
        message = message[:1024]
        why = Condition(
            type=type_, status="Unknown", reason=reason, message=message, observed_generation=generation
        )
        waiting = self.model_copy(
            update={"message": message, "conditions": set_condition(self.conditions, why, now)}
        )
        return waiting.with_ready(generation, now, (reason, message))

    def merge_patch(self, *fields: str) -> dict[str, Any]:
        """The merge patch of ``status`` that sets ``fields`` and leaves the others alone."""
        patch: dict[str, Any] = self.model_dump(by_alias=True, mode="json", include=set(fields))
        return patch

    def with_ready(
        self, generation: int | None, now: datetime, held: tuple[str, str] | None = None
    ) -> ModelVersionStatus:
        """This status with its ``Ready`` condition said from the rest of it.

        False with ``held`` (reason, message) when the writer knows what holds the version
        (hashing, a store to retry: the phase may still be the last generation's), else True
        when the phase is Ready, else False with the reason of the first condition that is
        False, then of the first that is Unknown.
        """
        if held is not None:
            status, (reason, message) = "False", held
        elif self.phase == "Ready":
            status, reason, message = "True", "VerifiedAndRecorded", self.message or "verified and recorded"
        else:
            others = [c for c in self.conditions if c.type != READY]
            why = next((c for c in others if c.status == "False"), None) or next(
                (c for c in others if c.status == "Unknown"), None
            )
            status = "False"
            reason, message = (why.reason, why.message) if why else (self.phase, self.message or "")
        ready = Condition(
            type=READY, status=status, reason=reason, message=message, observed_generation=generation
        )
        return self.model_copy(update={"conditions": set_condition(self.conditions, ready, now)})


class ModelVersion(Resource[ModelVersionSpec, ModelVersionStatus]):
    kind: Literal["ModelVersion"] = "ModelVersion"

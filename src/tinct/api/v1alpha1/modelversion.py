"""ModelVersion: one version of a model and its artifacts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tinct.api.v1alpha1.common import DNS_NAME, Condition, Model, Resource

#: semver 2.0.0, https://semver.org (no leading "v").
SEMVER = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(\+([0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*))?$"
)
#: Where artifacts can live: a volume mounted into the operator, or an object store.
ARTIFACT_URI = r"^(file|s3|gs|az)://.+$"
SHA256 = r"^[a-f0-9]{64}$"

ArtifactFormat = Literal["onnx", "ptx", "safetensors", "tokenizer"]
QuantizationMethod = Literal["none", "awq", "gptq", "fp8", "int8", "smoothquant"]
Runtime = Literal["tensorrt-llm", "vllm", "onnxruntime", "triton", "tgi", "llama-cpp"]
#: Misversioned: verified and recorded, but its interface changed more than its declared
#: version step allows (condition InterfaceCompatible=False); it cannot be released as declared.
ModelVersionPhase = Literal["Pending", "Hashing", "Ready", "Misversioned", "Failed", "Retired"]

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
    sha256: Digest | None = Field(default=None, description="Expected digest; a mismatch fails the version.")


class Artifact(Model):
    """One file of the version. Several files of one format (shards) are allowed."""

    format: ArtifactFormat = Field(
        description=(
            "What the file is; its content is validated against it. safetensors includes the "
            "shards' index (*.safetensors.index.json); tokenizer is tokenizer.json or tokenizer_config.json."
        )
    )
    uri: Uri
    sha256: Digest | None = Field(default=None, description="Expected digest; a mismatch fails the version.")


class Quantization(Model):
    method: QuantizationMethod = "none"
    bits: Literal[2, 3, 4, 8, 16] | None = Field(default=None, description="Weight bits.")
    symmetric: bool = True
    group_size: int | None = Field(
        default=None, ge=1, le=65536, description="Quantization group size (AWQ/GPTQ)."
    )


class ModelVersionSpec(Model):
    model: str = Field(
        pattern=DNS_NAME, min_length=1, max_length=253, description="Model family, e.g. llama3-8b."
    )
    version: str = Field(pattern=SEMVER, max_length=128, description="Semantic version, e.g. 2.0.0.")
    source: Source | None = None
    artifacts: list[Artifact] = Field(min_length=1, max_length=256)
    build_pipeline_id: str | None = Field(default=None, max_length=256)
    quantization: Quantization | None = None
    runtime: Runtime | None = Field(
        default=None, description="Serving runtime; quantization x runtime is checked."
    )


class Digests(Model):
    """Per-format digests; for a format with several files, the manifest digest."""

    onnx: str | None = None
    ptx: str | None = None
    safetensors: str | None = None
    tokenizer: str | None = None
    source: str | None = None


class ArtifactStatus(Model):
    uri: str
    format: str
    sha256: str
    size: int = Field(ge=0)


class LineageRef(Model):
    table: str = Field(description="URI of the model_versions Delta table.")
    version: int = Field(ge=0, description="Delta table version that holds this event.")


class InterfaceStatus(Model):
    """What the artifacts offer clients, as the operator measured it."""

    digest: str = Field(description="SHA-256 of the interface facts (equal interfaces, equal digests).")
    summary: str = Field(default="", max_length=1024, description="The interface in one line.")
    compared_with: str | None = Field(
        default=None,
        max_length=256,
        description="The ModelVersion (name@version) the interface was compared with, if any.",
    )


class Progress(Model):
    bytes_done: int = Field(default=0, ge=0)
    bytes_total: int = Field(default=0, ge=0)


class ModelVersionStatus(Model):
    phase: ModelVersionPhase = "Pending"
    message: str | None = None
    observed_generation: int | None = None
    digests: Digests | None = None
    artifacts: list[ArtifactStatus] | None = None
    interface: InterfaceStatus | None = None
    progress: Progress | None = None
    lineage: LineageRef | None = None
    conditions: list[Condition] = Field(default_factory=list)


class ModelVersion(Resource[ModelVersionSpec, ModelVersionStatus]):
    kind: Literal["ModelVersion"] = "ModelVersion"

"""Verification of one ModelVersion spec: compatibility, presence, format, digests.

:func:`verify` is blocking (it reads every byte of every artifact) and must run in a
thread. It returns a :class:`Verification`: either digests, or a :class:`Failure` a user
can act on. Transient storage faults are *raised* (:class:`StorageUnavailableError`) so the
caller retries instead of failing the version.

The steps run in order and the first that fails decides the outcome: the quantization x
runtime rules (no I/O), presence of every file (one ``stat`` each), the format of every
artifact (a few reads each), then the digests (every byte, compared with the declared
``sha256`` values).
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field

from tinct.api.v1alpha1.modelversion import ModelVersionSpec
from tinct.artifacts import compat
from tinct.artifacts.formats import DEFAULT_ONNX_PARSE_LIMIT, FormatError, validate
from tinct.artifacts.hashing import FileDigest, Progress, format_digests, hash_uri
from tinct.artifacts.storage import ArtifactNotFoundError, StorageConfig, stat_size

__all__ = ["Failure", "SpecFile", "Verification", "spec_files", "verify"]


@dataclass(frozen=True)
class Failure:
    """Why a version cannot be Ready. ``condition`` is the condition type set to False."""

    condition: str
    reason: str
    message: str


@dataclass
class Verification:
    files: list[tuple[str, FileDigest]] = field(default_factory=list)  # (format, digest); source last
    digests: dict[str, str] = field(default_factory=dict)
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class SpecFile:
    """One file a spec names: an artifact, or the source checkpoint (``index`` None)."""

    format: str  # "source" for the checkpoint
    uri: str
    sha256: str | None  # the declared digest, if any
    index: int | None  # position in spec.artifacts

    @property
    def field(self) -> str:
        """Path of the spec field that names this file, e.g. ``spec.artifacts[2]``."""
        return "spec.source" if self.index is None else f"spec.artifacts[{self.index}]"

    @property
    def what(self) -> str:
        return "source checkpoint" if self.index is None else f"{self.format} artifact"


def spec_files(spec: ModelVersionSpec) -> list[SpecFile]:
    """The artifacts in spec order, then the source checkpoint."""
    files = [SpecFile(a.format, a.uri, a.sha256, i) for i, a in enumerate(spec.artifacts)]
    if spec.source is not None:
        files.append(SpecFile("source", spec.source.uri, spec.source.sha256, None))
    return files


def _fail(reason: str, message: str) -> Verification:
    return Verification(failure=Failure("Verified", reason, message))


def _check_presence(files: list[SpecFile], config: StorageConfig | None) -> Verification | list[int]:
    """The size of every file, or the failure naming the first one that is not there."""
    sizes: list[int] = []
    for f in files:
        try:
            sizes.append(stat_size(f.uri, config))
        except ArtifactNotFoundError as exc:
            return _fail(
                "ArtifactMissing",
                f"{f.what} {f.uri} not found ({exc.detail}): upload it or fix {f.field}.uri, "
                "then change the spec to verify again",
            )
    return sizes


def _check_formats(
    files: list[SpecFile], executor: Executor, config: StorageConfig | None, onnx_parse_limit: int
) -> Verification | None:
    """None when every artifact is a valid file of its format; else the first failure."""
    checks = [
        (f, executor.submit(validate, f.uri, f.format, config, onnx_parse_limit=onnx_parse_limit))
        for f in files
        if f.index is not None
    ]
    for f, check in checks:
        try:
            check.result()
        except FormatError as exc:
            return _fail(
                "InvalidFormat", f"{exc} ({f.field}.uri): re-export the artifact or correct its format"
            )
        except ArtifactNotFoundError as exc:
            return _fail("ArtifactMissing", f"{f.uri} vanished: {exc.detail}")
    return None


def _check_digests(
    files: list[SpecFile], executor: Executor, config: StorageConfig | None, progress: Progress | None
) -> Verification:
    """Hash every file; the digests, or the first declared digest that does not match."""
    on_bytes = progress.add if progress is not None else None
    hashing = [executor.submit(hash_uri, f.uri, config, on_bytes=on_bytes) for f in files]
    first_error: BaseException | None = None
    digests: list[FileDigest] = []
    for fut in hashing:  # wait for all, so no thread still reads when this returns
        try:
            digests.append(fut.result())
        except Exception as exc:
            first_error = first_error or exc
    if isinstance(first_error, ArtifactNotFoundError):
        return _fail("ArtifactMissing", f"{first_error}: upload it or fix the URI")
    if first_error is not None:
        raise first_error
    for f, d in zip(files, digests, strict=True):
        if f.sha256 is not None and f.sha256.lower() != d.sha256:
            return _fail(
                "DigestMismatch",
                f"{f.format} {f.uri} has sha256 {d.sha256} but {f.field}.sha256 declares {f.sha256}: "
                "the file changed after the digest was taken, or the declared digest is wrong",
            )
    pairs = [(f.format, d) for f, d in zip(files, digests, strict=True)]
    return Verification(files=pairs, digests=format_digests((fmt, d.sha256) for fmt, d in pairs))


def verify(
    spec: ModelVersionSpec,
    executor: Executor,
    *,
    config: StorageConfig | None = None,
    progress: Progress | None = None,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> Verification:
    """Check ``spec`` end to end; validation and hashing fan out on ``executor``.

    Raises:
        StorageUnavailableError: a store failed in a way that may pass; retry later.
    """
    violations = compat.check(spec.quantization, spec.runtime)
    if violations:
        return Verification(
            failure=Failure("Compatible", violations[0].reason, "; ".join(str(v) for v in violations))
        )
    files = spec_files(spec)
    sizes = _check_presence(files, config)
    if isinstance(sizes, Verification):
        return sizes
    if progress is not None:
        progress.total = sum(sizes)
    bad_format = _check_formats(files, executor, config, onnx_parse_limit)
    if bad_format is not None:
        return bad_format
    return _check_digests(files, executor, config, progress)

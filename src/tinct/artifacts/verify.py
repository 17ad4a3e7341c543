"""Verification of one ModelVersion spec: compatibility, presence, format, digests.

:func:`verify` is blocking (it reads every byte of every artifact) and must run in a
thread. It returns a :class:`Verification`: either digests, or a :class:`Failure` a user
can act on. Transient storage faults are *raised* (:class:`StorageUnavailableError`) so the
caller retries instead of failing the version.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

from tinct.api.v1alpha1.modelversion import ModelVersionSpec
from tinct.artifacts import compat
from tinct.artifacts.formats import DEFAULT_ONNX_PARSE_LIMIT, FormatError, validate
from tinct.artifacts.hashing import FileDigest, Progress, format_digests, hash_uri
from tinct.artifacts.storage import ArtifactNotFoundError, StorageConfig, stat_size

__all__ = ["Failure", "Verification", "verify"]


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


def _field_path(i: int | None) -> str:
    return "spec.source.uri" if i is None else f"spec.artifacts[{i}].uri"


def verify(
    spec: ModelVersionSpec,
    executor: Executor,
    *,
    config: StorageConfig | None = None,
    progress: Progress | None = None,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> Verification:
    """Check ``spec`` end to end; hashing and validation fan out on ``executor``.

    Raises:
        StorageUnavailableError: a store failed in a way that may pass; retry later.
    """
    violations = compat.check(spec.quantization, spec.runtime)
    if violations:
        return Verification(
            failure=Failure("Compatible", violations[0].reason, "; ".join(str(v) for v in violations))
        )

    # (index in spec.artifacts or None for source, format, uri, declared sha256)
    items: list[tuple[int | None, str, str, str | None]] = [
        (i, a.format, a.uri, a.sha256) for i, a in enumerate(spec.artifacts)
    ]
    if spec.source is not None:
        items.append((None, "source", spec.source.uri, spec.source.sha256))

    sizes: list[int] = []
    for i, fmt, uri, _ in items:
        try:
            sizes.append(stat_size(uri, config))
        except ArtifactNotFoundError as exc:
            what = "source checkpoint" if i is None else f"{fmt} artifact"
            return Verification(
                failure=Failure(
                    "Verified",
                    "ArtifactMissing",
                    f"{what} {uri} not found ({exc.detail}): upload it or fix {_field_path(i)}, "
                    "then change the spec to verify again",
                )
            )
    if progress is not None:
        progress.total = sum(sizes)

    checks: list[tuple[int | None, str, Future[None]]] = [
        (i, uri, executor.submit(validate, uri, fmt, config, onnx_parse_limit=onnx_parse_limit))
        for i, fmt, uri, _ in items
        if fmt != "source"
    ]
    for i, uri, check in checks:
        try:
            check.result()
        except FormatError as exc:
            return Verification(
                failure=Failure(
                    "Verified",
                    "InvalidFormat",
                    f"{exc} ({_field_path(i)}): re-export the artifact or correct its format",
                )
            )
        except ArtifactNotFoundError as exc:
            return Verification(
                failure=Failure("Verified", "ArtifactMissing", f"{uri} vanished: {exc.detail}")
            )

    on_bytes = progress.add if progress is not None else None
    hashed = [executor.submit(hash_uri, uri, config, on_bytes=on_bytes) for _, _, uri, _ in items]
    result = Verification()
    first_error: BaseException | None = None
    digests: list[FileDigest] = []
    for fut in hashed:
        try:
            digests.append(fut.result())
        except Exception as exc:
            first_error = first_error or exc
    if first_error is not None:
        if isinstance(first_error, ArtifactNotFoundError):
            return Verification(
                failure=Failure("Verified", "ArtifactMissing", f"{first_error}: upload it or fix the URI")
            )
        raise first_error

    for (i, fmt, uri, declared), d in zip(items, digests, strict=True):
        if declared is not None and declared.lower() != d.sha256:
            where = "spec.source.sha256" if i is None else f"spec.artifacts[{i}].sha256"
            return Verification(
                failure=Failure(
                    "Verified",
                    "DigestMismatch",
                    f"{fmt} {uri} has sha256 {d.sha256} but {where} declares {declared}: the file "
                    "changed after the digest was taken, or the declared digest is wrong",
                )
            )
        result.files.append((fmt, d))
    result.digests = format_digests((fmt, d.sha256) for fmt, d in result.files)
    return result

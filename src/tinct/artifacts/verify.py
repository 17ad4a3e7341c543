"""Verification of one ModelVersion spec: compatibility, admission, presence, format, digests.

:func:`verify` is a coroutine; every read runs on the version's
:class:`~tinct.artifacts.fair.Group` of a shared :class:`~tinct.artifacts.fair.FairPool`,
so versions share the workers fairly and cancelling the group stops the reads. It returns
a :class:`Verification`: either digests, or a :class:`Failure` a user can act on.
Transient storage faults are *raised* (:class:`StorageUnavailableError`) so the caller
retries instead of failing the version; cancelled work raises
:class:`~tinct.artifacts.fair.WorkCancelledError`.

The steps run in order and the first that fails decides the outcome: the quantization x
runtime rules (no I/O), admission of every URI (``file://`` only under the artifact
roots), presence of every file (one ``stat`` each), the format of every artifact (a few
reads each, which also give the file's interface facts), the interface the facts combine
into (:mod:`~tinct.artifacts.interface`), then the digests (every byte, compared with the
declared ``sha256`` values).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from tinct.api.v1alpha1.common import MESSAGE_MAX
from tinct.api.v1alpha1.modelversion import ModelVersionSpec
from tinct.artifacts import compat
from tinct.artifacts.fair import Group
from tinct.artifacts.formats import DEFAULT_ONNX_PARSE_LIMIT, FormatError, validate
from tinct.artifacts.hashing import FileDigest, Progress, format_digests, hash_steps
from tinct.artifacts.interface import Interface, InterfaceError, combine
from tinct.artifacts.limits import LimitExceededError
from tinct.artifacts.storage import (
    ArtifactNotFoundError,
    ArtifactRefusedError,
    StorageConfig,
    confine,
    stat_size,
)
from tinct.text import clip

__all__ = ["Failure", "SpecFile", "Verification", "spec_files", "verify"]


@dataclass(frozen=True)
class Failure:
    """Why a version cannot be Ready. ``condition`` is the condition type set to False."""

    condition: str
    reason: str
    message: str  # clipped to MESSAGE_MAX, whatever the files and the spec say

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", clip(self.message, MESSAGE_MAX))


@dataclass
class Verification:
    files: list[tuple[str, FileDigest]] = field(default_factory=list)  # (format, digest); source last
    digests: dict[str, str] = field(default_factory=dict)
    failure: Failure | None = None
    #: (format, uri, facts) of each artifact, in spec order; see tinct.artifacts.formats.
    facts: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    interface: Interface | None = None

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
    read_uri: str = ""  # what is actually read (see _admit); uri until then

    def __post_init__(self) -> None:
        if not self.read_uri:
            object.__setattr__(self, "read_uri", self.uri)

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


def _first_failure(files: Sequence[SpecFile], outcomes: Sequence[Any]) -> Verification | None:
    """The failure the first refused file is (in spec order), or None when every outcome is
    a result; an outcome that is another exception is raised (a transient fault).

    A file that is missing (or vanished between two steps), invalid or over a cap fails
    the version.
    """
    for f, outcome in zip(files, outcomes, strict=True):
        if isinstance(outcome, ArtifactNotFoundError):
            return _fail(
                "ArtifactMissing",
                f"{f.what} {f.uri} not found ({outcome.detail}): upload it or fix {f.field}.uri, "
                "then change the spec to verify again",
            )
        if isinstance(outcome, FormatError) and outcome.limit is not None:
            return _fail(
                "LimitExceeded",
                f"{f.uri} ({f.field}.uri) is over a limit of the operator: {outcome.detail}; "
                "docs/operations/limits.md lists them",
            )
        if isinstance(outcome, FormatError):
            return _fail(
                "InvalidFormat",
                f"{f.uri} is not valid {f.format}: {outcome.detail} ({f.field}.uri): "
                "re-export the artifact or correct its format",
            )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return None


async def _results(futures: Sequence[Future[Any]]) -> list[Any]:
    """Every future's result or exception, once all are done (no read outlives the step)."""
    return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)


def _admit(files: list[SpecFile], roots: Sequence[str]) -> Verification | list[SpecFile]:
    """The files with the URI to read, or the failure naming the first one refused."""
    admitted: list[SpecFile] = []
    for f in files:
        try:
            admitted.append(replace(f, read_uri=confine(f.uri, roots)))
        except ArtifactRefusedError as exc:
            return _fail("ArtifactRefused", f"{f.field}.uri {exc}")
    return admitted


async def _check_presence(
    files: list[SpecFile], group: Group, config: StorageConfig | None
) -> Verification | list[int]:
    """The size of every file, or the failure naming the first one that is not there."""
    sizes = await _results([group.call(stat_size, f.read_uri, config) for f in files])
    failure = _first_failure(files, sizes)
    return sizes if failure is None else failure


async def _check_formats(
    files: list[SpecFile], group: Group, config: StorageConfig | None, onnx_parse_limit: int
) -> Verification | list[tuple[str, str, dict[str, Any]]]:
    """The facts of every artifact when each is a valid file of its format; else the first failure."""
    artifacts = [f for f in files if f.index is not None]
    outcomes = await _results(
        [
            group.call(validate, f.read_uri, f.format, config, onnx_parse_limit=onnx_parse_limit)
            for f in artifacts
        ]
    )
    failure = _first_failure(artifacts, outcomes)
    if failure is not None:
        return failure
    return [(f.format, f.uri, facts) for f, facts in zip(artifacts, outcomes, strict=True)]


async def _check_digests(
    files: list[SpecFile], group: Group, config: StorageConfig | None, progress: Progress | None
) -> Verification:
    """Hash every file; the digests, or the first declared digest that does not match."""
    on_bytes = progress.add if progress is not None else None
    outcomes = await _results(
        [group.submit(hash_steps(f.read_uri, config, on_bytes=on_bytes)) for f in files]
    )
    failure = _first_failure(files, outcomes)
    if failure is not None:
        return failure
    digests = [
        FileDigest(uri=f.uri, sha256=d.sha256, size=d.size) for f, d in zip(files, outcomes, strict=True)
    ]
    for f, d in zip(files, digests, strict=True):
        if f.sha256 is not None and f.sha256.lower() != d.sha256:
            return _fail(
                "DigestMismatch",
                f"{f.format} {f.uri} has sha256 {d.sha256} but {f.field}.sha256 declares {f.sha256}: "
                "the file changed after the digest was taken, or the declared digest is wrong",
            )
    pairs = [(f.format, d) for f, d in zip(files, digests, strict=True)]
    return Verification(files=pairs, digests=format_digests((fmt, d.sha256) for fmt, d in pairs))


async def verify(
    spec: ModelVersionSpec,
    group: Group,
    *,
    artifact_roots: Sequence[str],
    config: StorageConfig | None = None,
    progress: Progress | None = None,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> Verification:
    """Check ``spec`` end to end; every read runs on ``group``.

    ``artifact_roots`` are the directories ``file://`` URIs may point into; none means
    ``file://`` is refused.

    Raises:
        StorageUnavailableError: a store failed in a way that may pass; retry later.
        WorkCancelledError: ``group`` was cancelled.
    """
    violations = compat.check(spec.quantization, spec.runtime)
    if violations:
        return Verification(
            failure=Failure("Compatible", violations[0].reason, "; ".join(str(v) for v in violations))
        )
    files = _admit(spec_files(spec), artifact_roots)
    if isinstance(files, Verification):
        return files
    sizes = await _check_presence(files, group, config)
    if isinstance(sizes, Verification):
        return sizes
    if progress is not None:
        progress.total = sum(sizes)
    facts = await _check_formats(files, group, config, onnx_parse_limit)
    if isinstance(facts, Verification):
        return facts
    try:
        interface = combine(facts)
    except InterfaceError as exc:
        return _fail("InterfaceInconsistent", f"{exc}: re-export the {exc.fmt} artifacts together")
    except LimitExceededError as exc:
        return _fail("LimitExceeded", f"the artifacts together are over a limit of the operator: {exc}")
    verification = await _check_digests(files, group, config, progress)
    if verification.ok:
        verification.facts = facts
        verification.interface = interface
    return verification

"""Where bytes live: artifact URIs and lineage roots mapped onto pyarrow filesystems.

Supported schemes are ``file://`` (a volume mounted into the operator), ``s3://`` (AWS
or any S3-compatible store through an endpoint override), ``gs://`` and ``az://``.
Credentials are never part of a URI or of a custom resource: they come from the
operator's environment (the AWS/GCP/Azure SDK default chains, e.g. ``AWS_ACCESS_KEY_ID``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_KEY``), typically injected from
a Secret by the Helm chart.

Errors are split in two so callers can decide between failing a version and retrying:
:class:`ArtifactNotFoundError` (the object is not there; a user must act) and
:class:`StorageUnavailableError` (anything else the store said; retried with backoff).

``file://`` reads only what :func:`confine` lets through: files under the artifact roots
the operator was given, so a ModelVersion cannot make it read (and publish digests of)
anything else on its disks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from tinct.errors import AboutError

__all__ = [
    "ArtifactNotFoundError",
    "ArtifactRefusedError",
    "StorageConfig",
    "StorageError",
    "StorageUnavailableError",
    "UriError",
    "confine",
    "delta_storage_options",
    "resolve",
    "stat_size",
]


class UriError(AboutError):
    """Something about a URI (``about``); ``detail`` says what."""


class StorageError(UriError):
    """A storage operation on ``uri`` failed."""


class ArtifactNotFoundError(StorageError):
    """The object does not exist: a user has to upload it or fix the URI."""


class StorageUnavailableError(StorageError):
    """The store could not be reached or refused for a reason that may pass."""


class ArtifactRefusedError(UriError):
    """The operator will not read ``uri`` (not a storage fault: never retried)."""


def confine(uri: str, roots: Sequence[str]) -> str:
    """The URI to read for ``uri``: a ``file://`` URI only inside one of ``roots``.

    The path is percent-decoded and resolved (``..`` and every symlink) before it is
    compared with the resolved roots, and the resolved path is what gets read, so no
    spelling or link leads outside. A host part is refused, and with no roots every
    ``file://`` URI is. The refusal says the same whether the path exists or not.
    Other schemes pass unchanged.

    Raises:
        ArtifactRefusedError: the URI may not be read.
    """
    parts = urlsplit(uri)
    if parts.scheme.lower() != "file":
        return uri
    if not roots:
        raise ArtifactRefusedError(
            uri,
            "the operator reads no local files: start it with --artifact-root DIR "
            "(or TINCT_ARTIFACT_ROOTS) naming the directories file:// artifacts live in",
        )
    if parts.netloc:
        raise ArtifactRefusedError(uri, f"a file:// URI names no host ({parts.netloc!r}): write file:///path")
    if parts.query or parts.fragment:
        raise ArtifactRefusedError(uri, "a file:// URI has no ?query or #fragment; percent-encode ? and #")
    outside = ArtifactRefusedError(
        uri,
        f"not inside an artifact root ({', '.join(roots)}); the operator reads local files only "
        "there (--artifact-root)",
    )
    try:
        real = os.path.realpath(unquote(parts.path))
    except (ValueError, OSError):  # e.g. an encoded NUL byte
        raise outside from None
    for root in roots:
        top = os.path.realpath(root)
        if real != top and os.path.commonpath([real, top]) == top:
            return Path(real).as_uri()
    raise outside


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class StorageConfig:
    """Operator-side storage settings; every field defaults from the environment.

    ``s3_endpoint`` overrides the S3 endpoint (``http://minio:9000``) for S3-compatible
    stores; ``TINCT_S3_ENDPOINT`` wins over the SDK-wide ``AWS_ENDPOINT_URL``.
    """

    s3_endpoint: str | None = field(default_factory=lambda: _env("TINCT_S3_ENDPOINT", "AWS_ENDPOINT_URL"))
    s3_region: str | None = field(default_factory=lambda: _env("AWS_REGION", "AWS_DEFAULT_REGION"))
    azure_account: str | None = field(
        default_factory=lambda: _env("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT")
    )

    @property
    def s3_scheme(self) -> str:
        if self.s3_endpoint and self.s3_endpoint.startswith("http://"):
            return "http"
        return "https"

    @property
    def s3_endpoint_host(self) -> str | None:
        if not self.s3_endpoint:
            return None
        return self.s3_endpoint.split("://", 1)[-1].rstrip("/")


_FS_CACHE: dict[tuple[str, StorageConfig], pafs.FileSystem] = {}
_FS_LOCK = threading.Lock()


def _filesystem(scheme: str, config: StorageConfig) -> pafs.FileSystem:
    key = (scheme, config)
    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is not None:
            return fs
        if scheme == "file":
            fs = pafs.LocalFileSystem()
        elif scheme == "s3":
            fs = pafs.S3FileSystem(
                endpoint_override=config.s3_endpoint_host,
                scheme=config.s3_scheme,
                region=config.s3_region or "us-east-1",
                # Reads are ranged GETs of big blocks; pyarrow retries transient errors itself.
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
            )
        elif scheme == "gs":
            fs = pafs.GcsFileSystem()
        elif scheme == "az":
            if not config.azure_account:
                raise StorageUnavailableError(
                    "az://", "AZURE_STORAGE_ACCOUNT_NAME is not set for the operator"
                )
            fs = pafs.AzureFileSystem(account_name=config.azure_account)
        else:
            raise ValueError(f"unsupported URI scheme {scheme!r}")
        _FS_CACHE[key] = fs
        return fs


def resolve(uri: str, config: StorageConfig | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it for ``uri``.

    ``file:///abs/path`` and bare absolute paths are local; ``s3://bucket/key``,
    ``gs://bucket/key`` and ``az://container/blob`` become ``bucket/key``.
    """
    config = config or StorageConfig()
    if "://" not in uri:
        return _filesystem("file", config), os.path.abspath(uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return _filesystem("file", config), unquote(parts.path)
    if not parts.netloc:
        raise ValueError(f"{uri}: missing bucket/container")
    path = f"{parts.netloc}{unquote(parts.path)}".rstrip("/")
    return _filesystem(scheme, config), path


def classify(uri: str, exc: BaseException) -> StorageError:
    """Turn a filesystem exception into :class:`ArtifactNotFoundError` or :class:`StorageUnavailableError`."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return ArtifactNotFoundError(uri, "no such object")
    text = str(exc)
    lowered = text.lower()
    if "nosuchbucket" in lowered.replace(" ", "") or "bucket does not exist" in lowered:
        return ArtifactNotFoundError(uri, "no such bucket")
    return StorageUnavailableError(uri, text or type(exc).__name__)


def stat_size(uri: str, config: StorageConfig | None = None) -> int:
    """Size in bytes of the object at ``uri``; raises :class:`ArtifactNotFoundError` when absent."""
    try:
        fs, path = resolve(uri, config)
        info = fs.get_file_info(path)
    except Exception as exc:
        raise classify(uri, exc) from exc
    if info.type == pafs.FileType.NotFound:
        raise ArtifactNotFoundError(uri, "no such object")
    if info.type != pafs.FileType.File:
        raise ArtifactNotFoundError(uri, "not a file")
    return int(info.size)


def delta_storage_options(uri: str, config: StorageConfig | None = None) -> dict[str, str]:
    """``storage_options`` for deltalake for a table under ``uri``.

    On ``s3://`` a commit is a conditional put (``If-None-Match: *``, asked for with
    ``aws_conditional_put=etag``): a store that honours it refuses a second commit of the same
    version, so concurrent writers need no lock (:mod:`tinct.lineage.commits` checks the store).
    """
    config = config or StorageConfig()
    if not uri.startswith("s3://"):
        return {}
    opts: dict[str, str] = {"aws_conditional_put": "etag"}
    if config.s3_endpoint:
        opts["AWS_ENDPOINT_URL"] = config.s3_endpoint
        if config.s3_scheme == "http":
            opts["AWS_ALLOW_HTTP"] = "true"
    opts["AWS_REGION"] = config.s3_region or "us-east-1"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        value = os.environ.get(name)
        if value:
            opts[name] = value
    return opts

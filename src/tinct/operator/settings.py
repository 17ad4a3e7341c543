"""Operator configuration (environment / flags) and the kopf settings tinct runs with.

Every setting has an environment variable so ``kopf run -m tinct.operator.modelversion``
and ``tinct operator`` (which turns its flags into these variables) behave the same:

=============================  =================================================  ===========================
variable                       meaning                                            default
=============================  =================================================  ===========================
``TINCT_LINEAGE_ROOT``         root URI of the lineage tables (dir or ``s3://``)  ``/var/lib/tinct/lineage``
``TINCT_HASH_WORKERS``         threads hashing/validating artifacts               ``4``
``TINCT_S3_ENDPOINT``          S3 endpoint override (else ``AWS_ENDPOINT_URL``)   unset
``TINCT_ONNX_PARSE_LIMIT``     ONNX files up to this many bytes are fully parsed  ``67108864``
``TINCT_PROGRESS_INTERVAL``    seconds between progress updates in status         ``2``
``TINCT_PEERING``              kopf peering name for leader election              unset (standalone)
``TINCT_METRICS_PORT``         port of the operator's ``/metrics`` (0: none)       ``0``
``TINCT_RELEASE_TICK``         seconds between GrayRelease precondition checks    ``5``
``TINCT_CLUSTER_DOMAIN``       DNS suffix of Service URLs in routing tables       ``cluster.local``
=============================  =================================================  ===========================

kopf keeps its own progress in annotations prefixed ``tinct.io`` rather than in
``status.kopf``: the CRD schemas are structural and the API server would prune it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import kopf

from tinct.lineage.formats import DEFAULT_ONNX_PARSE_LIMIT
from tinct.lineage.storage import StorageConfig

__all__ = ["ANNOTATION_PREFIX", "FINALIZER", "OperatorConfig", "configure"]

ANNOTATION_PREFIX = "tinct.io"
FINALIZER = "tinct.io/finalizer"


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


@dataclass(frozen=True)
class OperatorConfig:
    lineage_root: str = "/var/lib/tinct/lineage"
    hash_workers: int = 4
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT
    progress_interval: float = 2.0
    peering: str | None = None
    storage: StorageConfig = field(default_factory=StorageConfig)
    metrics_port: int = 0
    release_tick: float = 5.0
    cluster_domain: str = "cluster.local"

    @classmethod
    def from_env(cls) -> OperatorConfig:
        root = os.environ.get("TINCT_LINEAGE_ROOT") or cls.lineage_root
        if root.startswith("file://"):
            root = root[len("file://") :]
        return cls(
            lineage_root=root,
            hash_workers=max(1, _int("TINCT_HASH_WORKERS", cls.hash_workers)),
            onnx_parse_limit=_int("TINCT_ONNX_PARSE_LIMIT", cls.onnx_parse_limit),
            progress_interval=_float("TINCT_PROGRESS_INTERVAL", cls.progress_interval),
            peering=os.environ.get("TINCT_PEERING") or None,
            storage=StorageConfig(),
            metrics_port=_int("TINCT_METRICS_PORT", cls.metrics_port),
            release_tick=max(0.1, _float("TINCT_RELEASE_TICK", cls.release_tick)),
            cluster_domain=os.environ.get("TINCT_CLUSTER_DOMAIN", cls.cluster_domain),
        )


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Apply tinct's choices to kopf's settings (called from the startup handler)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.enabled = True
    settings.posting.level = 20  # logging.INFO: Normal and Warning events reach users
    settings.watching.server_timeout = 300
    # kopf >= 1.40 calls it "queueing"; older releases "batching".
    queueing = getattr(settings, "queueing", None) or settings.batching
    queueing.worker_limit = 256
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        # Cluster-wide or namespaced peering follows the serving mode kopf.run set:
        # a ClusterKopfPeering for the whole cluster, a KopfPeering per served namespace.
